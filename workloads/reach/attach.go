package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The attach row: the server is started natively and loaded, then capped where it runs, and
// its time is the work after that.

// attachSupported says whether this farmem has `farmem attach`, and whether its attach takes
// --summary-json.
func attachSupported(farmem string) (ok, summary bool) {
	out, err := exec.Command(farmem, "attach", "--help").CombinedOutput()
	if err != nil {
		return false, false
	}
	return true, strings.Contains(string(out), "--summary-json")
}

// farmemAttach runs p natively and caps it with `farmem attach --local-mem CAP PID` once loaded.
func (r *reach) farmemAttach(p *program, dir string, limit time.Duration, o *outcome) {
	ok, withSummary := attachSupported(r.farmem)
	if !ok {
		o.status, o.detail = "not-run", "farmem attach missing"
		return
	}
	sum := filepath.Join(dir, "summary.json")
	os.Remove(sum)
	sampler := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	sampling := false // the sampler runs: from the moment the process has farmem's userfaultfd
	var attach *exec.Cmd
	var attachErr tailBuf
	attached := make(chan struct{})
	attachHook = func(pid int) error {
		args := []string{"attach", "--local-mem", strconv.FormatInt(o.capB, 10)}
		if withSummary {
			args = append(args, "--summary-json", sum)
		}
		attach = exec.Command(r.farmem, append(args, strconv.Itoa(pid))...)
		pr, pw, err := os.Pipe()
		if err != nil {
			return err
		}
		attach.Stderr = pw
		if err := attach.Start(); err != nil {
			pw.Close()
			pr.Close()
			return err
		}
		pw.Close()
		go func() {
			sc := bufio.NewScanner(pr)
			for sc.Scan() {
				attachErr.Write([]byte(sc.Text() + "\n"))
			}
			close(attached)
		}()
		// Attached when the process has a userfaultfd (farmem puts one in it, as in every
		// program it serves): seen from outside, whatever farmem attach prints.
		end := time.Now().Add(30 * time.Second)
		for time.Now().Before(end) {
			select {
			case <-attached:
				return fmt.Errorf("farmem attach exited before it attached: %s", tail(string(attachErr.b), 300))
			default:
			}
			if hasUffd(pid) {
				sampling = true
				go sampler.run(pid, o.capB)
				return nil
			}
			time.Sleep(5 * time.Millisecond)
		}
		return errors.New("no userfaultfd in the process 30 s after farmem attach started")
	}
	defer func() { attachHook = func(int) error { return nil } }()
	runServer(p, nil, dir, r.scale, limit, o)
	if sampling {
		close(sampler.stop)
		<-sampler.done
	}
	if attach != nil {
		// It runs until the process exits.
		done := make(chan error, 1)
		go func() { done <- attach.Wait() }()
		select {
		case err := <-done:
			if err != nil && o.status == "ok" {
				o.status, o.detail = "failed", fmt.Sprintf("farmem attach: %v: %s", err, tail(string(attachErr.b), 300))
			}
		case <-time.After(60 * time.Second):
			attach.Process.Kill()
			<-done
			if o.status == "ok" {
				o.status, o.detail = "failed", "farmem attach did not exit within 60 s of the program"
			}
		}
	}
	readSummary(sum, o)
	// The summary's peak counts what the process held when farmem attached: the cap is held
	// to what it holds once its pages above the cap went out.
	if sampling {
		o.peakB, o.peakSrc = sampler.peak, "sampled"
		if !sampler.settled {
			o.detail = strings.TrimSpace(o.detail + " its anonymous RSS never fell to the cap")
		}
	}
}

// rssSampler samples a process's RssAnon every 20 ms: its peak from the first sample at or
// below the cap on (before it, the pages above the cap are still going out).
type rssSampler struct {
	stop, done chan struct{}
	settled    bool  // written by run, read after done
	peak       int64 // likewise
}

func (s *rssSampler) run(pid int, capB int64) {
	defer close(s.done)
	for {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if f := strings.Fields(l); len(f) == 3 && f[0] == "RssAnon:" {
					kb, _ := strconv.ParseInt(f[1], 10, 64)
					v := kb << 10
					if !s.settled && v <= capB {
						s.settled, s.peak = true, 0
					}
					s.peak = max(s.peak, v)
				}
			}
		}
		select {
		case <-s.stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// zramAttach runs p natively, loads it, then moves it into a memory cgroup (cgroup v1, with its
// charges: memory.move_charge_at_immigrate) and lowers the cgroup's limit to o.limitB, which the
// kernel reaches by swapping out.
func (r *reach) zramAttach(p *program, dir string, limit time.Duration, o *outcome) {
	cg := cgroupDir("reachrun")
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err != nil {
		o.status, o.detail = "not-run", "cgroup v2 moves no charges with a process: no Linux swap equivalent of attach"
		return
	}
	if _, err := swapCmd("cgroup", "reachrun", "0"); err != nil {
		o.status, o.detail = "failed", err.Error()
		return
	}
	// Without the charges, the pages the process has stay charged where they were, and a limit
	// on the new cgroup would never make them go.
	if err := os.WriteFile(filepath.Join(cg, "memory.move_charge_at_immigrate"), []byte("3"), 0); err != nil {
		o.status, o.detail = "not-run", fmt.Sprintf("this kernel moves no charges with a process (memory.move_charge_at_immigrate: %v): no Linux swap equivalent of attach", err)
		return
	}
	attachHook = func(pid int) error {
		if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return err
		}
		// The kernel reclaims down to the new limit before the write returns, or refuses
		// (EBUSY) if it could not: then the limit stays and the next try goes on.
		var err error
		for i := 0; i < 20; i++ {
			if err = os.WriteFile(filepath.Join(cg, "memory.limit_in_bytes"), []byte(strconv.FormatInt(o.limitB, 10)), 0); err == nil {
				// The peak from here on: the charge moved in with the process was above the cap.
				return os.WriteFile(filepath.Join(cg, "memory.max_usage_in_bytes"), []byte("0"), 0)
			}
			if !errors.Is(err, syscall.EBUSY) {
				break
			}
		}
		return fmt.Errorf("lowering the limit to the cap: %w", err)
	}
	defer func() { attachHook = func(int) error { return nil } }()
	runServer(p, nil, dir, r.scale, limit, o)
}

// asuserBin is asuser (asuser.c), built into the work directory.
func asuserBin() string { return filepath.Join(workDir, "asuser") }

func buildAsuser() error {
	src := filepath.Join(progDir(), "asuser.c")
	out, err := exec.Command("gcc", "-O2", "-Wall", "-o", asuserBin(), src).CombinedOutput()
	if err != nil {
		return fmt.Errorf("gcc asuser.c: %v: %s", err, out)
	}
	return os.Chmod(asuserBin(), 0o755)
}

// hasUffd says whether process pid holds a userfaultfd.
func hasUffd(pid int) bool {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false
	}
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && l == "anon_inode:[userfaultfd]" {
			return true
		}
	}
	return false
}
