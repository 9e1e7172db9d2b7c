package main

// End-to-end tests of `farmem run` on real programs. They need root (userfaultfd, /proc of
// other processes) and the binaries `make build` produces; `make test` runs them.

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/farmem/farmem/launcher"
	"github.com/farmem/farmem/runtime"
)

var binDir = func() string { d, _ := filepath.Abs("../../bin"); return d }()

func farmemBin(t *testing.T) string {
	t.Helper()
	p := filepath.Join(binDir, "farmem")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s missing: run `make build` first (make test does)", p)
	}
	return p
}

// testProgram builds testdata/name.c into dir and returns the program's path.
func testProgram(t *testing.T, dir, name string) string {
	t.Helper()
	prog := filepath.Join(dir, name)
	if b, err := exec.Command("gcc", "-O2", "-Wall", "-pthread", "-o", prog, filepath.Join("testdata", name+".c")).CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", name, err, b)
	}
	return prog
}

func need(t *testing.T, prog string) string {
	t.Helper()
	p, err := exec.LookPath(prog)
	if err != nil {
		t.Fatalf("%s is not installed (.ci/run installs it): %v", prog, err)
	}
	return p
}

// rssSampler samples RssAnon of every descendant of the farmem process.
type rssSampler struct {
	mu   sync.Mutex
	peak map[int]int64 // pid -> peak RssAnon bytes
	stop chan struct{}
	done chan struct{}
}

func sampleRSS(root int) *rssSampler {
	s := &rssSampler{peak: map[int]int64{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			for _, pid := range descendants(root) {
				if v := rssAnon(pid); v > 0 {
					s.mu.Lock()
					s.peak[pid] = max(s.peak[pid], v)
					s.mu.Unlock()
				}
			}
		}
	}()
	return s
}

func (s *rssSampler) finish() map[int]int64 { close(s.stop); <-s.done; return s.peak }

func descendants(root int) []int {
	var out []int
	var walk func(int)
	walk = func(pid int) {
		// Children are listed per thread that forked them: farmem forks from a locked thread.
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
		for _, t := range tasks {
			b, _ := os.ReadFile(t)
			for _, f := range strings.Fields(string(b)) {
				c, _ := strconv.Atoi(f)
				out = append(out, c)
				walk(c)
			}
		}
	}
	walk(root)
	return out
}

func rssAnon(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "RssAnon:") {
			kb, _ := strconv.ParseInt(strings.Fields(l)[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// capSlack is what a program may exceed the cap by. farmem caps the anonymous memory it
// registers; the kernel's count also holds what farmem does not manage: the program's page
// tables and other kernel memory, the page cache of its binary (when no earlier run cached it),
// mappings under 64 KiB, memory taken before the run armed and not yet found by the rescan (a
// thread's new stack), the shim's agent; and the cap is met a batch late, by
// the pages faulted in while an eviction batch is in flight. glibc's internal mappings are not in
// it: the mapping filter hands them to us as they are made (checkSeen). Every check logs the peak
// it saw and the cap, so the slack actually used is in every test log.
const capSlack = 4 << 20

// checkCap fails the test if the run took more than the cap and capSlack: by the kernel's exact
// peak of the run's memory cgroup, which every process of the run is born in (farmem's summary
// gives it when the run had a memory cgroup of its own), and by every process's peak
// RssAnon as sampled (peaks). The cgroup's count includes page cache, which nothing caps without
// memory pressure: a program that writes files (redis's BGSAVE) is checked with
// checkSampledCap instead.
func checkCap(t *testing.T, s *launcher.Summary, peaks map[int]int64, capBytes int64) {
	t.Helper()
	if b, ok := cgroupPeak(t, s, capBytes); ok && b > capBytes+capSlack {
		t.Errorf("the run's memory cgroup peaked at %.1f MiB: more than the cap %d MiB and %d MiB", float64(b)/(1<<20), capBytes>>20, capSlack>>20)
	}
	checkSampledCap(t, peaks, capBytes)
}

// cgroupPeak returns the peak of the run's memory cgroup from farmem's summary, and logs it.
func cgroupPeak(t *testing.T, s *launcher.Summary, capBytes int64) (bytes int64, ok bool) {
	t.Helper()
	if s.CgroupPeakBytes == nil {
		t.Logf("no memory cgroup peak in the summary (no memory cgroup of the run's own, or no memory.peak): only RssAnon samples")
		return 0, false
	}
	t.Logf("the run's memory cgroup peaked at %.1f MiB (cap %d MiB)", float64(*s.CgroupPeakBytes)/(1<<20), capBytes>>20)
	return *s.CgroupPeakBytes, true
}

// checkSampledCap fails the test if a process's peak RssAnon, as sampled, exceeds the cap and
// capSlack.
func checkSampledCap(t *testing.T, peaks map[int]int64, capBytes int64) {
	t.Helper()
	if len(peaks) == 0 {
		t.Fatalf("no RssAnon samples were taken")
	}
	for pid, v := range peaks {
		t.Logf("pid %d peak RssAnon %d KiB (cap %d KiB)", pid, v>>10, capBytes>>10)
		if v > capBytes+capSlack {
			t.Errorf("pid %d: peak RssAnon %d KiB exceeds the cap %d KiB by more than %d KiB", pid, v>>10, capBytes>>10, capSlack>>10)
		}
	}
}

// checkSeen fails the test unless the run saw the program's mappings as they were made: the
// mapping filter handed over glibc's internal mmap and brk calls, and the rescan found (next to)
// nothing written where no fault could have held it back.
func checkSeen(t *testing.T, s *launcher.Summary) {
	t.Helper()
	seen, unseen := s.MappingsSeen, s.UnseenPages
	if seen == 0 {
		t.Errorf("the mapping filter handed over none of glibc's mmap/brk calls")
	}
	if unseen > 256 {
		t.Errorf("the rescan found %d pages written to mappings nobody told us about: the mapping filter missed calls", unseen)
	}
}

// runSampled runs farmem with args (farmem run's, --summary-json added), sampling every
// process's RssAnon, and returns its output, its summary, the peaks, and how it exited.
func runSampled(t *testing.T, args ...string) (string, *launcher.Summary, map[int]int64, error) {
	t.Helper()
	args, summary := summarized(t, args)
	cmd := exec.Command(farmemBin(t), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := sampleRSS(cmd.Process.Pid)
	err := cmd.Wait()
	peaks := s.finish()
	t.Logf("%s", out.String())
	return out.String(), summary(), peaks, err
}

// runTorture runs the integrity torture under farmem at capMiB (with farmem's flags) and returns
// farmem's summary and the peak RssAnon of each process; it fails the test unless every unit
// verified.
func runTorture(t *testing.T, capMiB int, flags []string, args ...string) (*launcher.Summary, map[int]int64) {
	t.Helper()
	argv := append([]string{"run", "--local-mem", fmt.Sprintf("%dMiB", capMiB)}, flags...)
	argv = append(append(argv, "--", filepath.Join(binDir, "torture"), "--quiet"), args...)
	out, s, peaks, err := runSampled(t, argv...)
	if err != nil {
		t.Fatalf("torture under farmem failed: %v", err)
	}
	if !strings.Contains(out, "torture: OK") || !strings.Contains(out, "bad=0") {
		t.Fatalf("torture did not report OK")
	}
	return s, peaks
}

// Test 1 and 4: the integrity torture at ~10% of its footprint; every unit verified, and the
// cap measured from the kernel.
func TestTortureUnderCap(t *testing.T) {
	const capMiB = 16
	s, peaks := runTorture(t, capMiB, nil, "--mib", "160", "--rounds", "5")
	if !s.Armed || s.ArmedAtBytes != 0 {
		t.Fatalf("a 16MiB cap must arm at once (it is within the arming margin)")
	}
	if s.Faults["backend"].Count == 0 {
		t.Fatalf("no page came back from the backend: the cap did not force eviction")
	}
	// Both ways out of the program ran (evictor's doc): moving (the torture's pages before its
	// fork) and dropping (the pages its fork child still shares: EBUSY). UFFDIO_MOVE is 6.8's.
	if kernelAtLeast(t, 6, 8) && !someMovedOut(s) {
		t.Fatalf("want some pages moved out by the agent (UFFDIO_MOVE) and some dropped")
	}
	checkCap(t, s, peaks, capMiB<<20)
	checkSeen(t, s)
}

// Evicted pages compressed by the embedded store come back intact, and smaller while away:
// the micro workload's pages (structured words) compress; every page is verified on each pass.
func TestCompressedStore(t *testing.T) {
	for _, codec := range []string{"lz4", "zstd"} {
		t.Run(codec, func(t *testing.T) {
			out, s, peaks, err := runSampled(t, "run", "--local-mem", "16MiB", "--compress", codec, "--",
				filepath.Join(binDir, "micro"), "--mib", "64", "--pattern", "random", "--passes", "2")
			if err != nil || !strings.Contains(out, "micro: OK bad=0") {
				t.Fatalf("micro under farmem --compress %s: %v", codec, err)
			}
			if s.BackendPeakPages == 0 {
				t.Fatalf("no backend peak in the summary: nothing was evicted")
			}
			if ratio := float64(s.BackendPeakPages*4096) / float64(max(s.BackendPeakBytes, 1)); ratio <= 1.2 {
				t.Fatalf("%s kept micro's pages at %.2fx: not compressed", codec, ratio)
			}
			checkCap(t, s, peaks, 16<<20)
		})
	}
}

// A run starts unarmed and arms when its memory nears the cap: the pages touched before are
// adopted, evicted and come back intact, and the cap still holds.
func TestTortureArmsMidRun(t *testing.T) {
	const capMiB = 64
	s, peaks := runTorture(t, capMiB, nil, "--mib", "128", "--rounds", "3")
	if !s.Armed || s.ArmedAtBytes < 1<<20 {
		t.Fatalf("the run did not arm on its way past the cap")
	}
	if canWatchArming() && !s.ArmWatched {
		t.Fatalf("the run polled for its arming threshold where a memory cgroup could watch for it")
	}
	if s.Faults["backend"].Count == 0 {
		t.Fatalf("no page came back from the backend: the cap did not force eviction")
	}
	// Both ways out of the program ran (evictor's doc): moving (the torture's pages before its
	// fork) and dropping (the pages its fork child still shares: EBUSY). UFFDIO_MOVE is 6.8's.
	if kernelAtLeast(t, 6, 8) && !someMovedOut(s) {
		t.Fatalf("want some pages moved out by the agent (UFFDIO_MOVE) and some dropped")
	}
	checkCap(t, s, peaks, capMiB<<20)
	checkSeen(t, s)
}

// Below the cap nothing is registered and fork children (the torture forks every round) start
// afresh, with no FORK event to wait for; their data is the parent's.
func TestTortureBelowCapNeverArms(t *testing.T) {
	s, _ := runTorture(t, 1024, nil, "--mib", "64", "--rounds", "3")
	if s.Armed {
		t.Fatalf("a run far below its cap armed")
	}
	if canWatchArming() && !s.ArmWatched {
		t.Fatalf("the run polled for its arming threshold where a memory cgroup could watch for it")
	}
}

// canWatchArming reports whether farmem can put the program in a memory cgroup of its own
// (runtime.usageWatch): root, and a memory controller it may use, as farmem doctor checks.
func canWatchArming() bool {
	_, _, err := runtime.CheckUsageWatch()
	return err == nil && os.Geteuid() == 0
}

// someMovedOut reports whether the agent moved out some of the evicted pages (UFFDIO_MOVE) and
// the drop way took the others: between 1 and 99 % of them moved, rounded.
func someMovedOut(s *launcher.Summary) bool {
	pct := math.Round(100 * float64(s.Batches.Staged) / float64(max(s.Evicted.Written+s.Evicted.DroppedClean+s.Evicted.Zero, 1)))
	return pct >= 1 && pct <= 99
}

// Test 2: redis-server with its heap mostly evicted keeps its data through a full read pass,
// a fork (BGSAVE) and a reload from that fork's dump.
func TestRedisDigest(t *testing.T) {
	need(t, "redis-server")
	dir := t.TempDir()
	port := freePort(t)
	const capMiB = 24
	args, summary := summarized(t, []string{"run", "--local-mem", fmt.Sprintf("%dMiB", capMiB), "--",
		"redis-server", "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no",
		"--enable-debug-command", "yes", "--dir", dir, "--bind", "127.0.0.1"})
	cmd := exec.Command(farmemBin(t), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	r := dialRedis(t, port)
	s := sampleRSS(cmd.Process.Pid)
	r.must(t, "DEBUG", "POPULATE", "300000", "key", "200")
	d0 := r.must(t, "DEBUG", "DIGEST")
	// A full read pass: every value comes back through the fault path.
	var sum int
	for i := 0; i < 300000; i += 1000 {
		args := []string{"MGET"}
		for k := i; k < i+1000; k++ {
			args = append(args, fmt.Sprintf("key:%d", k))
		}
		v := r.must(t, args...)
		sum += len(v)
	}
	d1 := r.must(t, "DEBUG", "DIGEST")
	r.must(t, "BGSAVE")
	// The child faults nearly all of redis's heap back in under the same cap: with both CPUs
	// busy with other work it took 175 s (leap) and 310 s (--prefetch none) in one pair of runs
	// here, and failed a 2-minute wait. The wait is for a hang, not a deadline.
	for i := 0; ; i++ {
		info := r.must(t, "INFO", "persistence")
		if strings.Contains(info, "rdb_bgsave_in_progress:0") {
			if !strings.Contains(info, "rdb_last_bgsave_status:ok") {
				t.Fatalf("BGSAVE failed: %s", info)
			}
			break
		}
		if i > 9000 {
			t.Fatalf("BGSAVE did not finish in 15 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	d2 := r.must(t, "DEBUG", "DIGEST")
	r.must(t, "DEBUG", "RELOAD")
	d3 := r.must(t, "DEBUG", "DIGEST")
	mem := r.must(t, "INFO", "memory")
	peaks := s.finish()
	r.send("SHUTDOWN", "NOSAVE")
	cmd.Wait()
	t.Logf("digests %s %s %s %s; read %d bytes; farmem: %s", d0, d1, d2, d3, sum, lastLine(out.String()))
	if d0 == "" || strings.Trim(d0, "0") == "" || d0 != d1 || d1 != d2 || d2 != d3 {
		t.Fatalf("DEBUG DIGEST changed: populate %s, after read pass %s, after BGSAVE %s, after RELOAD %s", d0, d1, d2, d3)
	}
	// used_memory is what redis allocated; its RSS is what farmem let stay local.
	if used := fieldInt(mem, "used_memory"); used < 3*capMiB<<20 {
		t.Fatalf("redis used_memory %d is not well above the cap: the test does not page", used)
	}
	// The cgroup's peak holds the page cache of the RDB file BGSAVE writes and RELOAD reads: it
	// is logged, and the anonymous memory is checked by samples.
	cgroupPeak(t, summary(), capMiB<<20)
	checkSampledCap(t, peaks, capMiB<<20)
}

// Test 3: memcached grows through glibc malloc's internal mmap/brk, which the shim cannot see;
// the rescan must find and page it.
func TestMemcachedValues(t *testing.T) {
	need(t, "memcached")
	port := freePort(t)
	const capMiB = 24
	args, summary := summarized(t, []string{"run", "--local-mem", fmt.Sprintf("%dMiB", capMiB), "--",
		"memcached", "-p", strconv.Itoa(port), "-U", "0", "-l", "127.0.0.1", "-m", "1024", "-u", "root", "-t", "2"})
	cmd := exec.Command(farmemBin(t), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	s := sampleRSS(cmd.Process.Pid)
	c := dialRetry(t, port)
	defer c.Close()
	rw := bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
	const n = 100000
	val := func(i int) string { return strings.Repeat(fmt.Sprintf("%08x", i*2654435761), 128) } // 1 KiB
	for i := 0; i < n; i++ {
		v := val(i)
		fmt.Fprintf(rw, "set k%d 0 0 %d noreply\r\n%s\r\n", i, len(v), v)
		if i%500 == 499 {
			rw.Flush()
		}
	}
	rw.Flush()
	bad := 0
	for i := 0; i < n; i += 100 {
		fmt.Fprintf(rw, "get")
		for k := i; k < i+100; k++ {
			fmt.Fprintf(rw, " k%d", k)
		}
		fmt.Fprintf(rw, "\r\n")
		rw.Flush()
		for k := i; ; k++ {
			line, err := rw.ReadString('\n')
			if err != nil {
				t.Fatalf("memcached read: %v", err)
			}
			if line == "END\r\n" {
				if k != i+100 {
					bad += i + 100 - k
				}
				break
			}
			var key string
			var flags, size int
			fmt.Sscanf(line, "VALUE %s %d %d", &key, &flags, &size)
			buf := make([]byte, size+2)
			if _, err := ioReadFull(rw, buf); err != nil {
				t.Fatal(err)
			}
			idx, _ := strconv.Atoi(strings.TrimPrefix(key, "k"))
			if string(buf[:size]) != val(idx) {
				bad++
				if bad < 5 {
					t.Errorf("key %s: wrong value", key)
				}
			}
		}
	}
	peaks := s.finish()
	var rss int64
	for _, v := range peaks {
		rss = max(rss, v)
	}
	fmt.Fprintf(rw, "shutdown\r\n")
	rw.Flush()
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	t.Logf("farmem: %s", lastLine(out.String()))
	if bad != 0 {
		t.Fatalf("%d of %d values missing or wrong", bad, n)
	}
	sum := summary()
	if sum.Faults["backend"].Count == 0 {
		t.Fatalf("memcached was never paged (rescan did not register glibc's heap?): %s", out.String())
	}
	checkCap(t, sum, peaks, capMiB<<20)
}

// Test 5: if the runtime dies, the program dies too; it never runs on zeros.
func TestRuntimeDeathStopsProgram(t *testing.T) {
	cmd := exec.Command(farmemBin(t), "run", "--local-mem", "16MiB", "--",
		filepath.Join(binDir, "torture"), "--mib", "128", "--rounds", "1000", "--quiet")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var child int
	for i := 0; i < 200 && child == 0; i++ {
		time.Sleep(20 * time.Millisecond)
		if d := descendants(cmd.Process.Pid); len(d) > 0 {
			child = d[0]
		}
	}
	if child == 0 {
		t.Fatal("torture never started")
	}
	time.Sleep(1500 * time.Millisecond) // well into paging
	cmd.Process.Kill()
	cmd.Wait()
	for i := 0; i < 100; i++ {
		if err := syscall.Kill(child, 0); err == syscall.ESRCH {
			return
		}
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child)); strings.Contains(string(b), ") Z ") {
			return // dead, waiting to be reaped by init
		}
		time.Sleep(50 * time.Millisecond)
	}
	syscall.Kill(child, syscall.SIGKILL)
	t.Fatalf("program %d still running 5 s after farmem was killed", child)
}

// A fork child of the program (redis's BGSAVE) dies with farmem too. farmem's parent-death
// signal reaches only the program it started; the child, faulting its parent's evicted heap back
// in (or its agent waiting on a REMOVE), would otherwise sleep in the kernel for ever once farmem
// is gone. Each process's lifeline pipe (shim.c) is what ends it: before it, this child hung in
// handle_userfault, measured with a kill 50 ms and 300 ms into the BGSAVE.
func TestRuntimeDeathStopsForkChild(t *testing.T) {
	need(t, "redis-server")
	// Where the kill lands decides whether a thread is waiting on farmem at that moment (one
	// try in six hung without the lifeline here): four kills, at four points of the BGSAVE.
	for _, after := range []time.Duration{0, 50 * time.Millisecond, 150 * time.Millisecond, 400 * time.Millisecond} {
		port := freePort(t)
		cmd := exec.Command(farmemBin(t), "run", "--local-mem", "24MiB", "--",
			"redis-server", "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no",
			"--enable-debug-command", "yes", "--dir", t.TempDir(), "--bind", "127.0.0.1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r := dialRedis(t, port)
		r.must(t, "DEBUG", "POPULATE", "200000", "key", "1000") // 200 MB against a 24 MiB cap
		r.must(t, "BGSAVE")
		var tree []int
		for i := 0; i < 100 && len(tree) < 2; i++ { // redis and its BGSAVE child
			time.Sleep(10 * time.Millisecond)
			tree = descendants(cmd.Process.Pid)
		}
		if len(tree) < 2 {
			cmd.Process.Kill()
			t.Fatalf("no BGSAVE child under farmem: %v", tree)
		}
		time.Sleep(after) // the child is faulting the heap back in
		cmd.Process.Kill()
		cmd.Wait()
		for _, pid := range tree {
			if !exitsWithin(pid, 10*time.Second) {
				wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
				syscall.Kill(pid, syscall.SIGKILL)
				t.Errorf("killed %v into the BGSAVE: process %d of redis's tree still there 10 s after farmem (waiting in %s)", after, pid, wchan)
			}
		}
	}
}

// Test 6: bad input gets one line naming the problem and nothing runs: exit status 125 for
// farmem's own flags, 127 for a program not found, 126 for one that cannot be run under farmem.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	script := filepath.Join(dir, "noexec.sh")
	os.WriteFile(script, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o644)
	noInterp := filepath.Join(dir, "nointerp.sh")
	os.WriteFile(noInterp, []byte("#!/nonexistent/farmem-shell\ntouch "+marker+"\n"), 0o755)
	text := filepath.Join(dir, "text")
	os.WriteFile(text, []byte("touch "+marker+"\n"), 0o755)
	touch := []string{"/bin/sh", "-c", "touch " + marker}
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown flag", append([]string{"run", "--local-mem", "64MiB", "--bogus", "--"}, touch...), 125, "flag provided but not defined: -bogus"},
		{"unknown top-level flag", []string{"--bogus"}, 125, "flag provided but not defined: -bogus"},
		{"no program", []string{"run", "--local-mem", "64MiB"}, 125, "no program given"},
		{"no cap", append([]string{"run", "--"}, touch...), 125, "--local-mem SIZE is required"},
		{"bad unit", append([]string{"run", "--local-mem", "12XB", "--"}, touch...), 125, `cannot parse size "12XB"`},
		{"negative", append([]string{"run", "--local-mem", "-5MiB", "--"}, touch...), 125, `must be positive`},
		{"zero", append([]string{"run", "--local-mem", "0", "--"}, touch...), 125, `size "0" must be positive`},
		{"ambiguous", append([]string{"run", "--local-mem", "512mb", "--"}, touch...), 125, `"mb" is ambiguous: write 512M or 512MiB`},
		{"percent over 100", append([]string{"run", "--local-mem", "150%", "--"}, touch...), 125, `size "150%": give a percentage of the machine's memory above 0 and at most 100`},
		{"exponent", append([]string{"run", "--local-mem", "1e9", "--"}, touch...), 125, `cannot parse size "1e9": no exponents`},
		{"below minimum", append([]string{"run", "--local-mem", "1MiB", "--"}, touch...), 125, "--local-mem 1MiB (1MiB) is below the minimum of 16MiB"},
		{"percent below minimum", append([]string{"run", "--local-mem", "0.0001%", "--"}, touch...), 125, "--local-mem 0.0001% ("},
		{"token without ctrl", append([]string{"run", "--local-mem", "64MiB", "--token-file", script, "--"}, touch...), 125, "give --ctrl"},
		{"ctrl without token", append([]string{"run", "--local-mem", "64MiB", "--ctrl", "127.0.0.1:1", "--"}, touch...), 125, "--token-file is required with --ctrl"},
		{"not found", []string{"run", "--local-mem", "64MiB", "--", "no-such-program-farmem"}, 127, `program "no-such-program-farmem" not found`},
		{"no such path", []string{"run", "--local-mem", "64MiB", "--", filepath.Join(dir, "nope")}, 127, "not found"},
		{"bad flag and not found", []string{"run", "--local-mem", "64MiB", "--evict-heat", "16", "--", "no-such-program-farmem"}, 125, "--evict-heat 16"},
		{"not executable", []string{"run", "--local-mem", "64MiB", "--", script}, 126, "cannot be run: permission denied"},
		{"directory", []string{"run", "--local-mem", "64MiB", "--", dir}, 126, "cannot be run"},
		{"missing interpreter", []string{"run", "--local-mem", "64MiB", "--", noInterp}, 126, `interpreter "/nonexistent/farmem-shell" cannot be read`},
		{"neither ELF nor script", []string{"run", "--local-mem", "64MiB", "--", text}, 126, "neither an ELF executable nor a #! script"},
		{"unknown codec", append([]string{"run", "--local-mem", "64MiB", "--compress", "lzma", "--"}, touch...), 125, `unknown codec "lzma" (valid: none, lz4, zstd)`},
		{"unknown prefetcher", append([]string{"run", "--local-mem", "64MiB", "--prefetch", "oracle", "--"}, touch...), 125, `unknown prefetcher "oracle": choose one of leap, streams, readahead, stride, nextn, none`},
		{"prefetch max 0", append([]string{"run", "--local-mem", "64MiB", "--prefetch-max", "0", "--"}, touch...), 125, "--prefetch-max 0: give 1 to 32 pages"},
		{"prefetch max too big", append([]string{"run", "--local-mem", "64MiB", "--prefetch-max", "64", "--"}, touch...), 125, "--prefetch-max 64: give 1 to 32 pages"},
		{"evict heat too big", append([]string{"run", "--local-mem", "64MiB", "--evict-heat", "16", "--"}, touch...), 125, "--evict-heat 16: give 0 to 15"},
		{"write guess unknown", append([]string{"run", "--local-mem", "64MiB", "--write-guess", "always", "--"}, touch...), 125, `--write-guess "always": give auto or last`},
		{"evict heat negative", append([]string{"run", "--local-mem", "64MiB", "--evict-heat", "-1", "--"}, touch...), 125, "--evict-heat -1: give 0 to 15"},
		{"prefetch mode unknown", append([]string{"run", "--local-mem", "64MiB", "--prefetch-mode", "ring", "--"}, touch...), 125, `--prefetch-mode "ring": give map or cache`},
		{"cache pages in map mode", append([]string{"run", "--local-mem", "64MiB", "--prefetch-cache-pages", "100", "--"}, touch...), 125, "--prefetch-cache-pages applies to --prefetch-mode cache"},
		{"cache pages over half the cap", append([]string{"run", "--local-mem", "64MiB", "--prefetch-mode", "cache", "--prefetch-cache-pages", "9000", "--"}, touch...), 125, "--prefetch-cache-pages 9000: give 1 to 8192 (half the cap)"},
		{"prefetch history 1", append([]string{"run", "--local-mem", "64MiB", "--prefetch-history", "1", "--"}, touch...), 125, "--prefetch-history 1: give at least 2"},
		{"trace not writable", append([]string{"run", "--local-mem", "64MiB", "--record-faults", filepath.Join(dir, "no", "such", "dir"), "--"}, touch...), 125, "--record-faults: "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(farmemBin(t), c.args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := -1
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
			if code != c.code {
				t.Errorf("exit status %d, want %d (stderr %q)", code, c.code, stderr.String())
			}
			if !strings.HasPrefix(stderr.String(), "farmem: ") || !strings.Contains(stderr.String(), c.want) {
				t.Errorf("stderr %q does not say farmem: ...%q", stderr.String(), c.want)
			}
			if n := strings.Count(strings.TrimSpace(stderr.String()), "\n"); n != 0 {
				t.Errorf("want one line, got %d:\n%s", n+1, stderr.String())
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("the program ran")
			}
		})
	}
}

// The program's exit status is farmem's, whatever it is: a program exiting 2 (or 125, 126,
// 127) makes farmem exit the same, and a program killed by signal N makes it exit 128+N.
func TestExitStatus(t *testing.T) {
	for _, c := range []struct {
		sh   string
		want int
	}{
		{"exit 0", 0}, {"exit 1", 1}, {"exit 2", 2}, {"exit 7", 7}, {"exit 125", 125}, {"exit 126", 126}, {"exit 127", 127}, {"exit 255", 255},
		{"kill -TERM $$", 128 + 15}, {"kill -KILL $$", 128 + 9},
	} {
		var stderr bytes.Buffer
		cmd := exec.Command(farmemBin(t), "run", "--quiet", "--local-mem", "32MiB", "--", "/bin/sh", "-c", c.sh)
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != c.want {
			t.Errorf("sh -c %q: farmem exited %d, want %d", c.sh, code, c.want)
		}
		if stderr.Len() != 0 {
			t.Errorf("sh -c %q: farmem said %q: the program's status is no failure of farmem's", c.sh, stderr.String())
		}
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndex(s, "\n")+1:]
}

func fieldInt(info, key string) int64 {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), key+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func dialRetry(t *testing.T, port int) net.Conn {
	for i := 0; i < 300; i++ {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			return c
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("server on port %d never came up", port)
	return nil
}

// kernelAtLeast reports whether the running kernel is major.minor or later.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	var ma, mi int
	if _, err := fmt.Sscanf(b.String(), "%d.%d", &ma, &mi); err != nil {
		t.Fatalf("kernel release %q: %v", b.String(), err)
	}
	return ma > major || ma == major && mi >= minor
}

// exitsWithin reports whether process pid has exited (gone, or a zombie) within d.
func exitsWithin(pid int, d time.Duration) bool {
	for end := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(b), ") Z ") {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// A program named without a slash whose only match on PATH is not executable is found but
// cannot be run: 126 and a line that says which file, as a shell says, not 127.
func TestNotExecutableOnPath(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	prog := filepath.Join(dir, "farmem-noexec-on-path")
	os.WriteFile(prog, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o644)
	cmd := exec.Command(farmemBin(t), "run", "--local-mem", "64MiB", "--", "farmem-noexec-on-path")
	cmd.Env = append(os.Environ(), "PATH="+dir+":/usr/bin:/bin")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	code := -1
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	want := `farmem: program "farmem-noexec-on-path" cannot be run: ` + prog + " is not executable\n"
	if code != 126 || stderr.String() != want {
		t.Errorf("exit %d, stderr %q; want 126, %q", code, stderr.String(), want)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the program ran")
	}
}
