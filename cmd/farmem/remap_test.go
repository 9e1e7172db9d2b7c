package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A program that moves a 16 MiB buffer back and forth with mremap under a 16 MiB cap, as glibc's
// realloc moves a growing buffer, while another thread faults in a second buffer, reads back
// every page it touches as its own, and farmem never finds a page absent that it records
// resident. An eviction batch chooses its victims by address; a move of a victim made after the
// program put another page at its address would take that page for the victim (the agent's
// moves are fenced with the program's layout changes). In both fault modes, with victims moved
// out while the buffer moves.
func TestRemapWhileEvicting(t *testing.T) {
	dir := t.TempDir()
	prog := testProgram(t, dir, "remappong")
	for _, mode := range []string{"farmem", "program"} {
		for run := range 2 {
			summary := filepath.Join(dir, "summary.json")
			out, err := exec.Command(farmemBin(t), "run", "--local-mem", "16MiB", "--serve-faults", mode, "--summary-json", summary, "--",
				prog, "16", "1500").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "ok 1500") {
				t.Fatalf("faults served by %s, run %d: %v\n%s", mode, run, err, out)
			}
			var s struct {
				Batches struct{ Staged int64 } `json:"batches"`
			}
			b, err := os.ReadFile(summary)
			if err == nil {
				err = json.Unmarshal(b, &s)
			}
			if err != nil || s.Batches.Staged == 0 {
				t.Fatalf("faults served by %s, run %d: no victim was moved out (%v): the test needs moves", mode, run, err)
			}
		}
	}
}
