package launcher

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/farmem/farmem/runtime"
)

// ofTheRun accepts farmem's descendants, a child and a grandchild, and nothing else: init,
// farmem's own parent, farmem itself (no process of the run), a pid that is not there.
func TestOfTheRun(t *testing.T) {
	rt := &runtime.Runtime{} // serves no process: only the descent counts
	child := exec.Command("/bin/sh", "-c", "sleep 30 & echo $!; wait")
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	var grandchild int
	if _, err := fmt.Fscan(out, &grandchild); err != nil {
		t.Fatal(err)
	}
	defer func() { p, _ := os.FindProcess(grandchild); p.Kill() }()
	for _, c := range []struct {
		name string
		pid  int
		want bool
	}{
		{"child", child.Process.Pid, true},
		{"grandchild", grandchild, true},
		{"init", 1, false},
		{"farmem's parent", os.Getppid(), false},
		{"farmem", os.Getpid(), false},
		{"no such process", 1 << 30, false},
	} {
		if got := ofTheRun(rt, c.pid); got != c.want {
			t.Errorf("ofTheRun(%s, %d) = %v, want %v", c.name, c.pid, got, c.want)
		}
	}
}
