package runtime

import (
	"os"
	"os/exec"
	"testing"
)

// sameMemory tells a process that shares another's address space from one that does not: a
// process with itself, and a child that exec'd (its memory its own).
func TestSameMemory(t *testing.T) {
	self := os.Getpid()
	if same, err := sameMemory(self, self); err != nil || !same {
		t.Fatalf("sameMemory(self, self) = %v, %v; want true", same, err)
	}
	cmd := exec.Command("sleep", "10")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	if same, err := sameMemory(cmd.Process.Pid, self); err != nil || same {
		t.Fatalf("sameMemory(child, self) = %v, %v; want false", same, err)
	}
	if _, err := sameMemory(1<<22+1, self); err == nil {
		t.Fatal("sameMemory of no such process: no error")
	}
}
