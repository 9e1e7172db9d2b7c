package main

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The runtime workloads' command lines, run natively at a small scale the way a run runs them
// (h.exec from the repository root): each finishes, has a throughput, prints a checksum that
// verify takes when it equals the native run's and refuses otherwise. The JVM's program is
// the same under both collectors, so its checksum must be too. java and node come from
// scripts/test-deps.sh (make test installs them).
func TestRuntimeWorkloads(t *testing.T) {
	t.Chdir("../../..") // the commands name workloads/... from the repository root
	jvmClasses = t.TempDir()
	t.Cleanup(func() { jvmClasses = "bin/jvm" })
	wls, err := workloads([]string{"jvm-g1", "jvm-parallel", "node"}, 0.05)
	if err != nil {
		t.Fatal(err)
	}
	if err := prepareRuntimes(wls); err != nil {
		t.Fatal(err)
	}
	h := &harness{ctx: context.Background(), refs: map[string]*ref{}}
	sums := map[string]string{}
	for _, w := range wls {
		res, out, hwm, err := h.exec(w, nil, 5*time.Minute)
		if err != nil || res.timeout {
			t.Fatalf("%s: %v (timed out %v)\n%s", w.name, err, res.timeout, out)
		}
		if res.tput <= 0 || hwm <= 0 {
			t.Errorf("%s: throughput %v, peak %d bytes: want both > 0\n%s", w.name, res.tput, hwm, out)
		}
		m := w.digest.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s: no OK checksum line:\n%s", w.name, out)
		}
		sums[w.name] = m[1]
		h.refs[w.name] = &ref{checksum: m[1]}
		if err := h.verify(w, out); err != nil {
			t.Errorf("%s: its own output does not verify: %v", w.name, err)
		}
		other := strings.Replace(out, "checksum="+m[1], "checksum=0123456789abcdef", 1)
		if err := h.verify(w, other); err == nil || !strings.Contains(err.Error(), "the native run's is "+m[1]) {
			t.Errorf("%s: a different checksum verified (error %v)", w.name, err)
		}
		bad := strings.Replace(out, ": OK ", ": BAD ", 1)
		if err := h.verify(w, bad); err == nil {
			t.Errorf("%s: output without its OK line verified", w.name)
		}
	}
	if sums["jvm-g1"] != sums["jvm-parallel"] {
		t.Errorf("HeapGraph's checksum depends on the collector: G1 %s, Parallel %s", sums["jvm-g1"], sums["jvm-parallel"])
	}
}

// A bad command line gets a usage error (exit 2), not a run.
func TestRuntimeWorkloadsBadFlags(t *testing.T) {
	t.Chdir("../../..")
	jvmClasses = t.TempDir()
	t.Cleanup(func() { jvmClasses = "bin/jvm" })
	if err := compileHeapGraph(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{javaBin, "-cp", jvmClasses, "HeapGraph", "--entries", "x"}, "heapgraph: bad number for --entries: x"},
		{[]string{javaBin, "-cp", jvmClasses, "HeapGraph", "--entries", "8"}, "heapgraph: --entries must be at least 16"},
		{[]string{javaBin, "-cp", jvmClasses, "HeapGraph", "--rounds", "3"}, "heapgraph: unknown flag --rounds"},
		{[]string{nodeBin, objectsJS, "--objects", "-1"}, "objects: bad number for --objects: -1"},
		{[]string{nodeBin, objectsJS, "--passes"}, "objects: missing value for --passes"},
		{[]string{nodeBin, objectsJS, "--objects", "100", "--passes", "0"}, "objects: --objects must be at least 16 and --passes at least 1"},
	} {
		out, err := exec.Command(c.args[0], c.args[1:]...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.HasPrefix(string(out), c.want) {
			t.Errorf("%s: %v, output %q: want exit 2 and %q", strings.Join(c.args[2:], " "), err, out, c.want)
		}
	}
}

// Every workload with a checksum takes it from its own OK line (pagerank and matmul as they
// print it), and verify holds a run to the native run's.
func TestDigestLines(t *testing.T) {
	wls, err := workloads([]string{"pagerank", "numpy-matmul"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct{ out, sum string }{
		{"pagerank: iter1 secs=0.5 edges_per_sec=1000\npagerank: OK checksum=00ab12cd34ef5678 top=7 top_rank=0.0123\n", "00ab12cd34ef5678"},
		{"matmul: rep1 secs=1.0 gflops=0.5\nmatmul: OK n=1024 checksum=5566:7788 gflops=0.50\n", "5566:7788"},
	} {
		w := wls[i]
		m := w.digest.FindStringSubmatch(c.out)
		if m == nil || m[1] != c.sum {
			t.Errorf("%s: checksum %v, want %s", w.name, m, c.sum)
			continue
		}
		h := &harness{refs: map[string]*ref{w.name: {checksum: c.sum}}}
		if err := h.verify(w, c.out); err != nil {
			t.Errorf("%s: %v", w.name, err)
		}
		h.refs[w.name].checksum = "99"
		if err := h.verify(w, c.out); err == nil {
			t.Errorf("%s: verified against another native checksum", w.name)
		}
	}
}
