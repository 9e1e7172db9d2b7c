package main

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/farmem/farmem/procfs"
)

// fillFree is the program of TestOwnMemoryFollowsTheStore: it fills MIB mebibytes with a
// pattern (no page of zeros, which the store keeps as nothing), reads every byte back, frees it
// all at once (one munmap), says "freed" and waits for a line on stdin; then it fills and checks
// 64 MiB more, which the store keeps in the pages it gave back, and says "ok".
const fillFree = `
import sys
pat = bytearray(range(256))
def fill(mib):
    b = pat * (mib << 12)
    blk = pat * 4096
    for i in range(0, len(b), 1 << 20):
        if b[i:i + (1 << 20)] != blk:
            print("BAD at", i, flush=True)
            sys.exit(1)
    return b
b = fill(int(sys.argv[1]))
del b
print("freed", flush=True)
sys.stdin.readline()
c = fill(64)
print("ok", flush=True)
`

// ownMemSlack is the constant part of farmem's own memory that the target allows beside its
// store: its code, heap, stacks and page tables.
const ownMemSlack = 64 << 20

// farmem's own memory follows what its embedded store holds, by the kernel's count: its peak
// RSS (VmHWM) is at most 1.1 times the store's peak and ownMemSlack; and once the program has
// freed what it stored, farmem's RSS falls back to that slack (and 1.1 times the little the
// store still holds, under the cap), rather than staying at the most the store ever held.
func TestOwnMemoryFollowsTheStore(t *testing.T) {
	// lz4 keeps the pattern's pages in the smallest size class, sixteen to a page of its own.
	for _, codec := range []string{"none", "lz4"} {
		t.Run(codec, func(t *testing.T) { ownMemoryFollowsTheStore(t, codec) })
	}
}

func ownMemoryFollowsTheStore(t *testing.T, codec string) {
	const capMiB, fillMiB = 32, 384
	args, summary := summarized(t, []string{"run", "--local-mem", fmt.Sprintf("%dMiB", capMiB), "--compress", codec, "--",
		need(t, "python3"), "-c", fillFree, fmt.Sprint(fillMiB)})
	cmd := exec.Command(farmemBin(t), args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "freed" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the program did not free its memory: %q\n%s", lines.Text(), stderr.String())
	}
	// The store frees the program's slots as farmem reads the unmap's events, which may be
	// a moment after the program's munmap returned: wait for the fall, and fail only if it
	// has not come within a bound far above that moment.
	bound := int64(ownMemSlack + 11*(capMiB<<20)/10)
	var rss int64
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if rss, err = procfs.StatusBytes(cmd.Process.Pid, "VmRSS"); err != nil {
			t.Fatal(err)
		}
		if rss <= bound || time.Now().After(deadline) {
			break
		}
	}
	io.WriteString(stdin, "go on\n")
	for lines.Scan() {
		t.Logf("program: %s", lines.Text())
		if lines.Text() == "ok" {
			break
		}
	}
	io.Copy(io.Discard, stdout)
	err = cmd.Wait()
	t.Logf("%s", stderr.String())
	if err != nil {
		t.Fatalf("farmem run failed: %v", err)
	}
	s := summary()
	t.Logf("farmem's peak RSS %d MiB, the store's peak %d MiB (%d pages); after the free farmem's RSS %d MiB",
		s.FarmemPeakRSSBytes>>20, s.BackendPeakBytes>>20, s.BackendPeakPages, rss>>20)
	if s.BackendPeakPages < (fillMiB-2*capMiB)<<20/4096 {
		t.Fatalf("the store peaked at %d pages: the fill of %d MiB under a %d MiB cap did not go to it", s.BackendPeakPages, fillMiB, capMiB)
	}
	if s.FarmemPeakRSSBytes == 0 {
		t.Fatal("the summary has no farmem_peak_rss_bytes")
	}
	if want := 11*s.BackendPeakBytes/10 + ownMemSlack; s.FarmemPeakRSSBytes > want {
		t.Errorf("farmem's peak RSS %d MiB is more than 1.1 times its store's peak %d MiB and %d MiB (%d MiB)",
			s.FarmemPeakRSSBytes>>20, s.BackendPeakBytes>>20, ownMemSlack>>20, want>>20)
	}
	if rss > bound {
		t.Errorf("after the program freed its %d MiB, farmem's RSS stayed at %d MiB: more than %d MiB",
			fillMiB, rss>>20, bound>>20)
	}
}
