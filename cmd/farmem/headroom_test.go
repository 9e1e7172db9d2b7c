package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A program whose footprint fits just under its cap is never evicted from: the evictor's room
// below the cap starts small and grows only when faults wait at the cap. micro's 32 MiB scan
// holds about 32.3 MiB at a 33 MiB cap; with two batches (2 MiB) of room from the start, its
// loop over the footprint faulted back hundreds of pages at every pass.
func TestFootprintUnderTheCapNotEvicted(t *testing.T) {
	args, summary := summarized(t, []string{"run", "--local-mem", "33MiB", "--",
		filepath.Join(binDir, "micro"), "--mib", "32", "--pattern", "seq", "--passes", "3"})
	out, err := exec.Command(farmemBin(t), args...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "micro: OK bad=0") {
		t.Fatalf("micro under farmem failed: %v\n%s", err, out)
	}
	if s := summary(); s.Faults["backend"].Count != 0 || s.Evicted.Written+s.Evicted.DroppedClean+s.Evicted.Zero != 0 {
		t.Fatalf("a footprint under its cap was paged:\n%s", out)
	}
}
