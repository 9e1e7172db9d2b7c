package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// affinityProg touches 64 MiB twice from its main thread (about 32k faults at a 16 MiB cap:
// farmem pins it from its second placement check on), then reports the affinity of the main
// thread, of a thread it starts, of that thread's own child thread, and of a fork child; and
// the main thread's again after 2.5 s without a fault.
const affinityProg = `
import os, threading, time
a = bytearray(64 << 20)
for r in range(2):
    for i in range(0, len(a), 4096):
        a[i] = (a[i] + 1) & 0xff
print("main", len(os.sched_getaffinity(0)), flush=True)
res = {}
def inner():
    res["inner"] = len(os.sched_getaffinity(0))
def outer():
    res["thread"] = len(os.sched_getaffinity(0))
    t = threading.Thread(target=inner); t.start(); t.join()
t = threading.Thread(target=outer); t.start(); t.join()
print("thread", res["thread"], flush=True)
print("inner", res["inner"], flush=True)
pid = os.fork()
if pid == 0:
    print("child", len(os.sched_getaffinity(0)), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
time.sleep(2.5)
print("quiet", len(os.sched_getaffinity(0)), flush=True)
`

// A program whose one thread does the faulting is pinned to its CPU (the fault thread's), but
// what it starts is not: threads and fork children get the program's own affinity. Once it
// stops faulting, it gets its own back too.
func TestFaultingThreadPinnedNotWhatItStarts(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: nothing to pin")
	}
	py := need(t, "python3")
	script := filepath.Join(t.TempDir(), "affinity.py")
	if err := os.WriteFile(script, []byte(affinityProg), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(farmemBin(t), "run", "--quiet", "--local-mem", "16MiB", "--", py, script).CombinedOutput()
	if err != nil {
		t.Fatalf("farmem run: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			got[f[0]] = f[1]
		}
	}
	all := strconv.Itoa(runtime.NumCPU())
	want := map[string]string{"main": "1", "thread": all, "inner": all, "child": all, "quiet": all}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s holds %s CPUs, want %s (output:\n%s)", k, got[k], v, out)
		}
	}
}
