package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/launcher"
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

// A program that faults hard from two threads has both held on the fault thread's CPU, the same
// one, while it pages; after a quiet spell both may run anywhere again. Its data is checked.
func TestFaultingThreadsGathered(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: nothing to hold")
	}
	prog := testProgram(t, t.TempDir(), "gathered")
	sum := filepath.Join(t.TempDir(), "summary.json")
	out, err := exec.Command(farmemBin(t), "run", "--quiet", "--summary-json", sum, "--local-mem", "16MiB", "--", prog).CombinedOutput()
	if err != nil {
		t.Fatalf("farmem run: %v\n%s", err, out)
	}
	var s launcher.Summary
	if b, err := os.ReadFile(sum); err != nil || json.Unmarshal(b, &s) != nil {
		t.Fatalf("summary: %v\n%s", err, b)
	}
	if s.HeldThreadsMax != 2 || s.BusyReleases != 0 {
		t.Errorf("summary: held_threads_max %d, busy_releases %d; want 2 and 0", s.HeldThreadsMax, s.BusyReleases)
	}
	cpus := map[string]string{} // "paging 0" -> "1 CPU" etc.
	var check string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 4:
			cpus[f[0]+" "+f[1]] = f[2] + " " + f[3]
		case len(f) >= 2 && f[0] == "check":
			check = strings.Join(f[1:], " ")
		}
	}
	if check != "ok" {
		t.Fatalf("the data: %q\n%s", check, out)
	}
	p0, p1 := strings.Fields(cpus["paging 0"]), strings.Fields(cpus["paging 1"])
	if len(p0) != 2 || len(p1) != 2 || p0[0] != "1" || p1[0] != "1" || p0[1] != p1[1] {
		t.Errorf("while paging, the threads held (CPUs allowed, CPU) %v and %v; want both held to one and the same CPU\n%s", p0, p1, out)
	}
	all := strconv.Itoa(runtime.NumCPU())
	for _, k := range []string{"quiet 0", "quiet 1"} {
		if f := strings.Fields(cpus[k]); len(f) != 2 || f[0] != all {
			t.Errorf("%s: %v, want the program's %s CPUs back after a quiet spell\n%s", k, f, all, out)
		}
	}
}

// agentSchedProg reports the scheduling policy of each of its threads, then of a fork child's:
// under farmem, the shim's agent thread is among them.
const agentSchedProg = `
import os, threading
a = bytearray(32 << 20)
for i in range(0, len(a), 4096):
    a[i] = 1
def report(who):
    for tid in sorted(os.listdir("/proc/self/task")):
        print(who, tid == str(os.getpid()), os.sched_getscheduler(int(tid)), flush=True)
ev = threading.Event()
t = threading.Thread(target=ev.wait); t.start()
report("parent")
ev.set(); t.join()
pid = os.fork()
if pid == 0:
    b = bytearray(8 << 20)
    for i in range(0, len(b), 4096):
        b[i] = 1
    report("child")
    os._exit(0)
os.waitpid(pid, 0)
`

// The agent thread farmem puts in each process runs SCHED_FIFO, so that a batch's move and drop
// do not wait for the program's time slice; the program's own threads, a fork child's among
// them, keep their policy.
func TestAgentRunsRealtimeProgramDoesNot(t *testing.T) {
	py := need(t, "python3")
	script := filepath.Join(t.TempDir(), "sched.py")
	if err := os.WriteFile(script, []byte(agentSchedProg), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(farmemBin(t), "run", "--quiet", "--local-mem", "16MiB", "--", py, script).CombinedOutput()
	if err != nil {
		t.Fatalf("farmem run: %v\n%s", err, out)
	}
	count := map[string]map[string]int{"parent": {}, "child": {}}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 || count[f[0]] == nil {
			continue
		}
		policy, err := strconv.Atoi(f[2])
		if err != nil {
			t.Fatalf("policy %q: %v", f[2], err)
		}
		policy &^= unix.SCHED_RESET_ON_FORK
		switch {
		case policy == unix.SCHED_FIFO && f[1] == "False":
			count[f[0]]["agent"]++
		case policy == unix.SCHED_NORMAL:
			count[f[0]]["program"]++
		default:
			t.Errorf("thread with policy %s (main thread: %s) in %s", f[2], f[1], f[0])
		}
	}
	// The parent: its main thread, the one it started, and the agent; the child: its main
	// thread and its own agent.
	if p := count["parent"]; p["agent"] != 1 || p["program"] != 2 {
		t.Errorf("parent: %d SCHED_FIFO threads (want 1, the agent), %d SCHED_OTHER (want 2)\n%s", p["agent"], p["program"], out)
	}
	if c := count["child"]; c["agent"] != 1 || c["program"] != 1 {
		t.Errorf("fork child: %d SCHED_FIFO threads (want 1, its agent), %d SCHED_OTHER (want 1)\n%s", c["agent"], c["program"], out)
	}
}
