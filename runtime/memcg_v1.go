package runtime

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/procfs"
)

// memcgRoot is where the cgroup v1 memory controller is mounted.
const memcgRoot = cgroupMount + "/memory"

// memcgV1 is the run's cgroup v1 memory cgroup. Its usage thresholds are on an eventfd
// (cgroup.event_control): the kernel signals the eventfd whenever usage crosses one, either
// way, and checks thresholds every 128 pages charged on a CPU, a lag of 512 KiB a CPU against
// armMargin's 32 MiB or more, and against the evictor's headroom, which absorbs it as it absorbs
// faults.
type memcgV1 struct {
	dir     string
	parent  string   // farmem's own memory cgroup
	events  *os.File // the eventfd, read through the netpoller so close ends listen
	usage   int      // memory.usage_in_bytes, re-read with pread
	crossed chan struct{}
	buf     [32]byte // below's; only the rescan loop calls it
}

// newMemcgV1 makes the run's memory cgroup, arms a threshold at each of thresholds (bytes) and
// moves the calling thread (locked to its OS thread) into it: cgroup v1 places threads one by
// one, and a process is born in the cgroup of the thread that forked it, so the program farmem
// starts from this thread is charged to the cgroup from its first page, and so are its fork
// children.
func newMemcgV1(crossed chan struct{}, thresholds []int64) (m *memcgV1, err error) {
	parent, err := ownMemcgV1()
	if err != nil {
		return nil, err
	}
	sweepUsageWatches(parent)
	dir := filepath.Join(parent, runCgroupName())
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	m = &memcgV1{dir: dir, parent: parent, usage: -1, crossed: crossed}
	defer func() {
		if err != nil {
			m.close()
			m = nil
		}
	}()
	if m.usage, err = unix.Open(filepath.Join(dir, "memory.usage_in_bytes"), unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return nil, err
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, err
	}
	m.events = os.NewFile(uintptr(efd), "memcg-threshold")
	for _, b := range thresholds {
		// One eventfd may carry any number of thresholds: each crossing signals it.
		ctl := fmt.Sprintf("%d %d %d", efd, m.usage, b)
		if err := os.WriteFile(filepath.Join(dir, "cgroup.event_control"), []byte(ctl), 0); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "tasks"), []byte(strconv.Itoa(unix.Gettid())), 0); err != nil {
		return nil, err
	}
	go m.listen(m.events)
	return m, nil
}

// leave moves thread tid back to farmem's own cgroup (the cgroup could not be removed while it
// was there).
func (m *memcgV1) leave(tid int) error {
	return os.WriteFile(filepath.Join(m.parent, "tasks"), []byte(strconv.Itoa(tid)), 0)
}

// listen turns the eventfd's counts into crossed until the eventfd is closed. The netpoller's
// slow wakeup is no matter: this is off the fault path and wakes a few times a run.
func (m *memcgV1) listen(events *os.File) {
	var n [8]byte
	for {
		if _, err := events.Read(n[:]); err != nil {
			return
		}
		select {
		case m.crossed <- struct{}{}:
		default:
		}
	}
}

// below: the thresholds fire either way, so there is nothing to arm.
func (m *memcgV1) below(threshold int64) bool {
	drain(m.crossed)
	u, err := preadInt(m.usage, m.buf[:])
	return err == nil && u < threshold
}

// peak is memory.max_usage_in_bytes.
func (m *memcgV1) peak() (int64, bool) {
	v, err := readInt(filepath.Join(m.dir, "memory.max_usage_in_bytes"))
	return v, err == nil
}

func (m *memcgV1) close() {
	if m.events != nil {
		m.events.Close() // ends listen; the kernel drops the threshold with the cgroup
		m.events = nil
	}
	if m.usage >= 0 {
		unix.Close(m.usage)
		m.usage = -1
	}
	unix.Rmdir(m.dir)
}

// checkMemcgV1 makes a cgroup v1 memory cgroup in farmem's and removes it: nil, or why not.
func checkMemcgV1() error {
	parent, err := ownMemcgV1()
	if err != nil {
		return err
	}
	dir := filepath.Join(parent, fmt.Sprintf("farmem-check-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	return unix.Rmdir(dir)
}

// ownMemcgV1 is the directory of the cgroup v1 memory cgroup farmem runs in.
func ownMemcgV1() (string, error) {
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

// drain empties crossed: what it held is from before the caller's read.
func drain(crossed chan struct{}) {
	select {
	case <-crossed:
	default:
	}
}
