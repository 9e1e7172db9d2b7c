package runtime

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/procfs"
)

// memcgRoot is where the cgroup v1 memory controller is mounted.
const memcgRoot = "/sys/fs/cgroup/memory"

// usageWatch is told by the kernel when the programs' memory crosses one of two thresholds, so
// the runtime need not poll for it: the arming threshold (ArmPages), and, once armed, a level
// below which the programs are not near their cap (nearCapPages). Polling would have to be
// fast: the cap must hold against a program that grows at growthBound, so a program within
// armMargin of the arming threshold (a redis whose cap is 150 % of its peak, always), or armed at
// all, costs a statm read every fastestPoll, each a wakeup that disturbs the CPU it lands on,
// which a redis run felt (results/nopaging.md).
//
// It is a cgroup v1 memory cgroup of the run's own, a child of farmem's (so any limit farmem
// runs under still holds), with usage thresholds on an eventfd (cgroup.event_control): the
// kernel signals the eventfd whenever usage crosses one, either way. The program and its fork
// children are born in it (newUsageWatch). Usage counts more than anonymous memory (page cache,
// page tables), so an event comes early, never late; the kernel checks thresholds every 128
// pages charged on a CPU, a lag of 512 KiB a CPU against armMargin's 32 MiB or more, and
// against the evictor's headroom, which absorbs it as it absorbs faults.
//
// Where there is no v1 memory controller, or farmem may not make a cgroup, there is no watch
// and the runtime polls (pollInterval).
type usageWatch struct {
	dir     string
	parent  string        // farmem's own memory cgroup
	events  *os.File      // the eventfd, read through the netpoller so close ends listen
	usage   int           // memory.usage_in_bytes, re-read with pread
	crossed chan struct{} // an event since last drained (buffered 1)
	buf     [32]byte
}

// newUsageWatch makes the run's memory cgroup, arms a threshold at each of thresholds (bytes;
// those <= 0 are left out) and moves the calling thread (locked to its OS thread) into it:
// cgroup v1 places threads one by one, and a process is born in the cgroup of the thread that
// forked it, so the program farmem starts from this thread is charged to the cgroup from its
// first page, and so are its fork children.
func newUsageWatch(thresholds ...int64) (w *usageWatch, err error) {
	parent, err := ownMemcg()
	if err != nil {
		return nil, err
	}
	sweepUsageWatches(parent)
	dir := filepath.Join(parent, fmt.Sprintf("farmem-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	w = &usageWatch{dir: dir, parent: parent, usage: -1, crossed: make(chan struct{}, 1)}
	defer func() {
		if err != nil {
			w.close()
			w = nil
		}
	}()
	if w.usage, err = unix.Open(filepath.Join(dir, "memory.usage_in_bytes"), unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return nil, err
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, err
	}
	w.events = os.NewFile(uintptr(efd), "memcg-threshold")
	for _, b := range thresholds {
		if b <= 0 {
			continue
		}
		// One eventfd may carry any number of thresholds: each crossing signals it.
		ctl := fmt.Sprintf("%d %d %d", efd, w.usage, b)
		if err := os.WriteFile(filepath.Join(dir, "cgroup.event_control"), []byte(ctl), 0); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "tasks"), []byte(strconv.Itoa(unix.Gettid())), 0); err != nil {
		return nil, err
	}
	go w.listen()
	return w, nil
}

// leave moves thread tid back to farmem's own cgroup: once it has started the program, nothing
// of farmem's belongs in the run's (and the cgroup could not be removed while it was there).
func (w *usageWatch) leave(tid int) error {
	return os.WriteFile(filepath.Join(w.parent, "tasks"), []byte(strconv.Itoa(tid)), 0)
}

// listen turns the eventfd's counts into crossed until the eventfd is closed. The netpoller's
// slow wakeup is no matter: this is off the fault path and wakes a few times a run.
func (w *usageWatch) listen() {
	var n [8]byte
	for {
		if _, err := w.events.Read(n[:]); err != nil {
			return
		}
		select {
		case w.crossed <- struct{}{}:
		default:
		}
	}
}

// below reports whether the cgroup's usage is under threshold (bytes, one of the watch's), so
// that the runtime may wait for crossed. Events from before the call are drained first: one
// after it is a crossing the answer may not have seen.
func (w *usageWatch) below(threshold int64) bool {
	select {
	case <-w.crossed:
	default:
	}
	n, err := unix.Pread(w.usage, w.buf[:], 0)
	if err != nil || n <= 0 {
		return false
	}
	u, err := strconv.ParseInt(strings.TrimSpace(string(w.buf[:n])), 10, 64)
	return err == nil && u < threshold
}

// peak returns the most the cgroup was ever charged (memory.max_usage_in_bytes): the kernel's
// own peak of the programs' memory, anonymous memory, page cache and kernel memory together, the
// count a memory cgroup's limit holds to. Any goroutine; false once the cgroup is gone.
func (w *usageWatch) peak() (int64, bool) {
	b, err := os.ReadFile(filepath.Join(w.dir, "memory.max_usage_in_bytes"))
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v, err == nil
}

// close removes the cgroup; a second close does no more. The kernel refuses while a process is
// still in it (a daemon the program left behind); the next run sweeps it (sweepUsageWatches).
func (w *usageWatch) close() {
	if w.events != nil {
		w.events.Close() // ends listen; the kernel drops the threshold with the cgroup
		w.events = nil
	}
	if w.usage >= 0 {
		unix.Close(w.usage)
		w.usage = -1
	}
	unix.Rmdir(w.dir)
}

// CheckUsageWatch reports whether a run here can watch its programs' memory with a memory
// cgroup of its own (usageWatch), by making one and removing it: nil, or why not.
func CheckUsageWatch() error {
	parent, err := ownMemcg()
	if err != nil {
		return err
	}
	dir := filepath.Join(parent, fmt.Sprintf("farmem-check-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	return unix.Rmdir(dir)
}

// ownMemcg is the directory of the cgroup v1 memory cgroup farmem runs in.
func ownMemcg() (string, error) {
	path, err := procfs.OwnCgroup("memory")
	if err != nil {
		return "", err
	}
	dir := filepath.Join(memcgRoot, path)
	if _, err := os.Stat(filepath.Join(dir, "cgroup.event_control")); err != nil {
		return "", err
	}
	return dir, nil
}

// sweepUsageWatches removes the cgroups of earlier runs that were killed before they could: an
// rmdir of a cgroup some process is still in fails and leaves it be.
func sweepUsageWatches(parent string) {
	dirs, _ := filepath.Glob(filepath.Join(parent, "farmem-*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "farmem-"))
		if err != nil || pid == os.Getpid() || unix.Kill(pid, 0) != unix.ESRCH {
			continue
		}
		unix.Rmdir(d)
	}
}
