package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// A server of the table: started under the prefix with its socket in the run's directory,
// driven from here (outside the cap, natively), and stopped by its own command.
type server struct {
	// keys: how many items the load writes at scale 1.
	keys int
	// load writes the data (before `farmem attach` in the attach row; untimed there).
	load func(addr string, n int) error
	// work does the rest and returns the digest.
	work func(addr string, n int) (string, error)
	// stop asks the server to exit.
	stop func(addr, dir string) error
}

// value is item i's value in round r: 100-300 bytes, deterministic.
func value(i, r int) []byte {
	x := lcg(uint64(i)*2654435761 + uint64(r))
	n := 100 + x.next(200)
	b := make([]byte, n)
	for j := range b {
		b[j] = 'a' + byte(x.next(26))
	}
	return b
}

// runServer starts p's server under prefix, waits for its socket, times the load and the work
// (the work only, for the attach row: attach.go), stops it and waits for it to exit.
func runServer(p *program, prefix []string, dir string, scale float64, limit time.Duration, o *outcome) {
	s := p.server
	n := scaled(s.keys, scale, 2000)
	sock := filepath.Join(dir, p.name+".sock")
	sockDir := filepath.Join(dir, "pgsock")
	os.Remove(sock)
	var argv []string
	for _, a := range append(append([]string{}, prefix...), p.argv(dir, scale)...) {
		a = strings.ReplaceAll(a, "@SOCK@", sock)
		argv = append(argv, strings.ReplaceAll(a, "@SOCKDIR@", sockDir))
	}
	addr := sock
	if p.name == "postgres" {
		addr = sockDir
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	var errb tailBuf
	cmd.Stdout, cmd.Stderr = &errb, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		o.status, o.detail, o.exit = "failed", err.Error(), -1
		return
	}
	running.Store(int64(cmd.Process.Pid))
	defer running.Store(0)
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	start := time.Now()
	deadline := start.Add(limit)
	kill := func() {
		killTree(cmd.Process.Pid)
		<-exited
	}
	// hung: what the server's processes were doing when the watchdog killed them (below).
	var hung atomic.Value
	fail := func(err error) {
		if time.Now().After(deadline) {
			// What its processes were doing, and what it said, for whoever reads the CSV.
			state, _ := hung.Load().(string)
			if state == "" {
				state = treeState(cmd.Process.Pid)
			}
			o.status, o.wall = "timeout", time.Since(start).Seconds()
			o.detail = fmt.Sprintf("%v; its processes: %s; its output: %s", err, state, tail(string(errb.b), 300))
			kill()
			o.exit = exitCode(cmd.ProcessState)
			return
		}
		select {
		case <-exited:
			o.exit = exitCode(cmd.ProcessState)
			o.status, o.detail = "failed", fmt.Sprintf("%v; the server exited %d: %s", err, o.exit, tail(string(errb.b), 300))
			return
		default:
		}
		o.status, o.detail = "failed", fmt.Sprintf("%v; its processes: %s; its output: %s", err, treeState(cmd.Process.Pid), tail(string(errb.b), 300))
		kill()
		o.exit = exitCode(cmd.ProcessState)
	}
	if err := waitReady(p.name, addr, exited, min(60*time.Second, limit)); err != nil {
		fail(err)
		return
	}
	// The rest runs against the deadline: a watchdog kills the server then, which fails the
	// client's next request.
	stopWatch := make(chan struct{})
	defer close(stopWatch)
	go func() {
		select {
		case <-stopWatch:
		case <-exited:
		case <-time.After(time.Until(deadline)):
			hung.Store(treeState(cmd.Process.Pid))
			killTree(cmd.Process.Pid)
		}
	}()
	t0 := time.Now()
	if err := s.load(addr, n); err != nil {
		fail(fmt.Errorf("load: %w", err))
		return
	}
	if p.attach {
		// attach.go's hook: the cap takes hold here, and the clock starts again.
		if err := attachHook(cmd.Process.Pid); err != nil {
			fail(fmt.Errorf("attach: %w", err))
			return
		}
		t0 = time.Now()
	}
	d, err := s.work(addr, n)
	if err != nil {
		fail(fmt.Errorf("work: %w", err))
		return
	}
	o.wall = time.Since(t0).Seconds()
	if shmemCgroup != "" {
		// Its shared memory, while it still has it: the native run's cgroup's count.
		o.sharedB = cgroupShmem(shmemCgroup)
	}
	if err := s.stop(addr, dir); err != nil {
		fail(fmt.Errorf("stop: %w", err))
		return
	}
	select {
	case <-exited:
	case <-time.After(time.Until(deadline) + 60*time.Second):
		fail(errors.New("it did not exit when asked"))
		return
	}
	o.exit = exitCode(cmd.ProcessState)
	if time.Now().After(deadline) {
		state, _ := hung.Load().(string)
		o.status, o.wall = "timeout", time.Since(start).Seconds()
		o.detail = fmt.Sprintf("it answered, then did not exit when asked; its processes when killed: %s; its output: %s", state, tail(string(errb.b), 300))
		return
	}
	if o.exit != 0 {
		o.status, o.detail = "failed", fmt.Sprintf("the server exited %d: %s", o.exit, tail(string(errb.b), 300))
		return
	}
	o.status, o.digest = "ok", d
}

// descendants returns pid's descendants (postgres's children leave its process group).
func descendants(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so from the last ')'.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 {
			parent[p], _ = strconv.Atoi(f[1])
		}
	}
	var out []int
	var walk func(int)
	walk = func(q int) {
		for c, pp := range parent {
			if pp == q {
				out = append(out, c)
				walk(c)
			}
		}
	}
	walk(pid)
	return out
}

// killTree kills pid's process group and every descendant of pid.
func killTree(pid int) {
	d := descendants(pid)
	syscall.Kill(-pid, syscall.SIGKILL)
	for _, c := range d {
		syscall.Kill(c, syscall.SIGKILL)
	}
}

// treeState is each process of pid's tree with its state and where the kernel has it waiting.
func treeState(pid int) string {
	var out []string
	for _, p := range append([]int{pid}, descendants(pid)...) {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", p))
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		s := string(st)
		state := ""
		if i := strings.LastIndexByte(s, ')'); i >= 0 && len(s) > i+2 {
			state = s[i+2 : i+3]
		}
		name := strings.SplitN(string(cmdline), "\x00", 2)[0]
		out = append(out, fmt.Sprintf("%d %s %s wchan=%s", p, filepath.Base(name), state, wchan))
	}
	return strings.Join(out, ", ")
}

// attachHook is set by the attach row's runner: it caps the server, pid, where it runs.
var attachHook = func(pid int) error { return nil }

// waitReady waits until the server answers on addr.
func waitReady(name, addr string, exited <-chan struct{}, limit time.Duration) error {
	end := time.Now().Add(limit)
	for time.Now().Before(end) {
		select {
		case <-exited:
			return errors.New("the server exited before it was ready")
		default:
		}
		if name == "postgres" {
			if exec.Command("/usr/bin/psql", "-h", addr, "-U", "postgres", "-Atc", "SELECT 1").Run() == nil {
				return nil
			}
		} else if c, err := net.Dial("unix", addr); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the server did not answer within %v", limit)
}

// ---- redis

// redisServer: N keys SET (the load), half of them rewritten, then DEBUG DIGEST (the work).
func redisServer(attach bool) *server {
	return &server{keys: 500_000,
		load: func(addr string, n int) error { return redisSet(addr, 0, n, 1, 0) },
		work: func(addr string, n int) (string, error) {
			if err := redisSet(addr, 0, n, 2, 1); err != nil {
				return "", err
			}
			r, err := redisDo(addr, "DEBUG DIGEST")
			return strings.TrimPrefix(r, "+"), err
		},
		stop: func(addr, _ string) error {
			c, err := net.Dial("unix", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("SHUTDOWN NOSAVE\r\n"))
			return err
		}}
}

// redisSet SETs keys from, from+step, ... below to, with round r's values, pipelined.
func redisSet(addr string, from, to, step, r int) error {
	return pipelinedSet(addr, from, to, step, func(w io.Writer, i int) {
		k, v := "key:"+strconv.Itoa(i), value(i, r)
		fmt.Fprintf(w, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(k), k, len(v), v)
	}, func(l string) bool { return strings.HasPrefix(l, "+OK") })
}

// pipelinedSet writes the set of each key from, from+step, ... below to over one connection to
// addr, 500 at a time before it reads their answers, each of which must be ok.
func pipelinedSet(addr string, from, to, step int, set func(w io.Writer, i int), ok func(answer string) bool) error {
	c, err := net.Dial("unix", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	w := bufio.NewWriterSize(c, 1<<16)
	rd := bufio.NewReader(c)
	pending := 0
	flush := func() error {
		if err := w.Flush(); err != nil {
			return err
		}
		for ; pending > 0; pending-- {
			l, err := rd.ReadString('\n')
			if err != nil {
				return err
			}
			if !ok(l) {
				return fmt.Errorf("a set was answered %q", strings.TrimSpace(l))
			}
		}
		return nil
	}
	for i := from; i < to; i += step {
		set(w, i)
		if pending++; pending == 500 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// redisDo sends one inline command and returns its one-line answer.
func redisDo(addr, command string) (string, error) {
	c, err := net.Dial("unix", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := c.Write([]byte(command + "\r\n")); err != nil {
		return "", err
	}
	l, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	l = strings.TrimSpace(l)
	if strings.HasPrefix(l, "-") {
		return "", fmt.Errorf("%s: %s", command, l)
	}
	return l, nil
}

// ---- memcached

// memcachedServer: N keys set (the load), half rewritten, then every value read back in key
// order and digested (the work).
func memcachedServer() *server {
	return &server{keys: 500_000,
		load: func(addr string, n int) error { return mcSet(addr, 0, n, 1, 0) },
		work: func(addr string, n int) (string, error) {
			if err := mcSet(addr, 0, n, 2, 1); err != nil {
				return "", err
			}
			return mcDigest(addr, n)
		},
		stop: func(addr, _ string) error {
			c, err := net.Dial("unix", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("shutdown\r\n"))
			return err
		}}
}

// mcSet sets keys from, from+step, ... below to, with round r's values, pipelined.
func mcSet(addr string, from, to, step, r int) error {
	return pipelinedSet(addr, from, to, step, func(w io.Writer, i int) {
		v := value(i, r)
		fmt.Fprintf(w, "set key:%d 0 0 %d\r\n%s\r\n", i, len(v), v)
	}, func(l string) bool { return l == "STORED\r\n" })
}

// mcDigest reads every key back, 100 to a get, and digests key and value in key order; a key
// missing (evicted by memcached for want of room) is an error.
func mcDigest(addr string, n int) (string, error) {
	c, err := net.Dial("unix", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	rd := bufio.NewReaderSize(c, 1<<16)
	h := sha256.New()
	for i := 0; i < n; i += 100 {
		var b strings.Builder
		b.WriteString("get")
		for j := i; j < min(n, i+100); j++ {
			fmt.Fprintf(&b, " key:%d", j)
		}
		b.WriteString("\r\n")
		if _, err := c.Write([]byte(b.String())); err != nil {
			return "", err
		}
		want := i
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				return "", err
			}
			if l == "END\r\n" {
				break
			}
			f := strings.Fields(l)
			if len(f) != 4 || f[0] != "VALUE" || f[1] != "key:"+strconv.Itoa(want) {
				return "", fmt.Errorf("get key:%d answered %q", want, strings.TrimSpace(l))
			}
			size, _ := strconv.Atoi(f[3])
			v := make([]byte, size+2)
			if _, err := io.ReadFull(rd, v); err != nil {
				return "", err
			}
			h.Write([]byte(f[1]))
			h.Write(v[:size])
			want++
		}
		if want != min(n, i+100) {
			return "", fmt.Errorf("key:%d is missing", want)
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:8]), nil
}

// ---- postgres

// postgresServer: one query (the work): N md5 strings sorted in memory and aggregated.
func postgresServer() *server {
	return &server{keys: 600_000,
		load: func(string, int) error { return nil },
		work: func(addr string, n int) (string, error) {
			q := fmt.Sprintf("SELECT md5(string_agg(v, '' ORDER BY v)) FROM (SELECT md5(i::text) AS v FROM generate_series(1, %d) i) t", n)
			out, err := exec.Command("/usr/bin/psql", "-h", addr, "-U", "postgres", "-X", "-Atc", q).CombinedOutput()
			if err != nil {
				return "", fmt.Errorf("psql: %v: %s", err, tail(string(out), 200))
			}
			return strings.TrimSpace(string(out)), nil
		},
		stop: func(_, dir string) error {
			// A fast shutdown: SIGINT to the postmaster, whose pid the data directory names.
			b, err := os.ReadFile(filepath.Join(dir, "pgdata", "postmaster.pid"))
			if err != nil {
				return err
			}
			pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
			if err != nil {
				return err
			}
			return syscall.Kill(pid, syscall.SIGINT)
		}}
}

// preparePostgres makes the database cluster (initdb, as the user postgres) and asuser.
func preparePostgres(dir string, _ float64) error {
	if err := buildAsuser(); err != nil {
		return err
	}
	for _, d := range []string{"pgdata", "pgsock"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return err
		}
		if err := exec.Command("chown", "postgres:postgres", filepath.Join(dir, d)).Run(); err != nil {
			return fmt.Errorf("chown %s to postgres: %v", d, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "pgdata", "PG_VERSION")); err == nil {
		return nil
	}
	cmd := exec.Command("/usr/sbin/runuser", "-u", "postgres", "--", initdbBin, "-D", filepath.Join(dir, "pgdata"),
		"-A", "trust", "-U", "postgres", "--no-sync")
	cmd.Dir = "/"
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %v: %s", err, tail(string(out), 300))
	}
	return nil
}

// shmemCgroup, when set (the native run of a server), is its memory cgroup's directory, whose
// count of shared memory (shmem) is read at the end of the work.
var shmemCgroup string

// cgroupShmem is the shared memory (tmpfs, shared anonymous mappings, SysV segments) charged to
// the memory cgroup at dir: v1's total_shmem, v2's shmem.
func cgroupShmem(dir string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && (f[0] == "total_shmem" || f[0] == "shmem") {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}
