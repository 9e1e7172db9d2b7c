package runtime

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/procfs"
)

// usageWatch is told by the kernel when the programs' memory crosses a threshold, so the runtime
// need not poll for it: the arming threshold (ArmPages), and, once armed, a level below which
// the programs are not near their cap (nearCapPages). Polling would have to be fast: the cap
// must hold against a program that grows at growthBound, so a program within armMargin of the
// arming threshold (a redis whose cap is 150 % of its peak, always), or armed at all, costs a
// statm read every fastestPoll, each a wakeup that disturbs the CPU it lands on, which a redis
// run felt (results/nopaging.md).
//
// It is a memory cgroup of the run's own, a child of farmem's (so any limit farmem runs under
// still holds), which the program and its fork children are born in (newUsageWatch). Its usage
// counts more than anonymous memory (page cache, page tables), so an event comes early, never
// late. How the kernel tells of a crossing depends on the cgroup version (memcgV1, memcgV2);
// both send on crossed, and below reads the usage.
//
// Where there is no memory controller, or farmem may not make a cgroup, there is no watch and
// the runtime polls (pollInterval).
type usageWatch struct {
	memcg
	crossed chan struct{} // an event since last drained (buffered 1)
}

// memcg is one cgroup version's run cgroup.
type memcg interface {
	// below drains crossed, then reports whether the cgroup's usage is under threshold (bytes,
	// one of the watch's), so that the runtime may wait for crossed: an event after the call
	// is a crossing the answer may not have seen.
	below(threshold int64) bool
	// peak returns the most the cgroup was ever charged: the kernel's own peak of the
	// programs' memory, anonymous memory, page cache and kernel memory together, the count a
	// memory cgroup's limit holds to. Any goroutine; false once the cgroup is gone.
	peak() (int64, bool)
	// leave ends the containing of thread tid (newUsageWatch's caller): once it has started
	// the program, nothing of farmem's belongs in the run's cgroup.
	leave(tid int) error
	// close removes the cgroup and undoes what making it changed; a second close does no more.
	// The kernel refuses while a process is still in it (a daemon the program left behind);
	// the next run sweeps it (sweepUsageWatches).
	close()
}

// newUsageWatch makes the run's memory cgroup with thresholds (bytes; those <= 0 are left out)
// and sees that the program the calling thread (locked to its OS thread) starts next with attr
// is born in it: on cgroup v1 by moving the thread in (a process is born in the cgroup of the
// thread that forked it); on v2, which moves whole processes only, by asking clone3 to start
// the child there (attr.UseCgroupFD). Its fork children are born there too.
func newUsageWatch(attr *syscall.SysProcAttr, thresholds ...int64) (*usageWatch, error) {
	w := &usageWatch{crossed: make(chan struct{}, 1)}
	v, err := cgroupVersion()
	if err != nil {
		return nil, err
	}
	var pos []int64
	for _, b := range thresholds {
		if b > 0 {
			pos = append(pos, b)
		}
	}
	if v == 1 {
		w.memcg, err = newMemcgV1(w.crossed, pos)
	} else {
		w.memcg, err = newMemcgV2(w.crossed, attr, pos)
	}
	if err != nil {
		return nil, err
	}
	return w, nil
}

// CheckUsageWatch reports which cgroup version a run here would watch its programs' memory
// with (1 or 2; 0: none), what it does there to make the run's cgroup, and nil or why it
// cannot (the run then polls). It leaves nothing changed.
func CheckUsageWatch() (version int, how string, err error) {
	version, err = cgroupVersion()
	if err != nil {
		return 0, "", err
	}
	if version == 1 {
		return 1, "", checkMemcgV1()
	}
	how, err = checkMemcgV2()
	return 2, how, err
}

// errNoMemcg: neither a cgroup v1 memory controller nor a cgroup v2 hierarchy is there.
var errNoMemcg = fmt.Errorf("no cgroup v1 memory controller, and %s is not a cgroup v2 hierarchy: %w", cgroupMount, fs.ErrNotExist)

// cgroupMount is where the cgroup v2 hierarchy is mounted, or, on v1, the tmpfs holding each
// v1 hierarchy (memcgRoot).
const cgroupMount = "/sys/fs/cgroup"

// cgroupVersion is the version of the cgroup hierarchy that holds the memory controller for
// farmem: 1 where /proc/self/cgroup names a v1 hierarchy with the memory controller (a hybrid
// machine's v2 hierarchy beside it has no controllers), else 2 where /sys/fs/cgroup is a cgroup2
// filesystem.
func cgroupVersion() (int, error) {
	if _, err := procfs.OwnCgroup("memory"); err == nil {
		return 1, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupMount, &st); err != nil {
		return 0, fmt.Errorf("%w (%v)", errNoMemcg, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return 0, errNoMemcg
	}
	return 2, nil
}

// runCgroupName is the name of the run's cgroup under farmem's own.
func runCgroupName() string { return fmt.Sprintf("farmem-%d", os.Getpid()) }

// sweepUsageWatches removes the cgroups earlier runs made in parent and were killed before they
// could remove (farmem-PID, and on v2 farmem-PID.self): an rmdir of a cgroup some process is
// still in fails and leaves it be.
func sweepUsageWatches(parent string) {
	dirs, _ := filepath.Glob(filepath.Join(parent, "farmem-*"))
	for _, d := range dirs {
		name, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), "farmem-"), ".")
		pid, err := strconv.Atoi(name)
		if err != nil || pid == os.Getpid() || unix.Kill(pid, 0) != unix.ESRCH {
			continue
		}
		unix.Rmdir(d)
	}
}

// readInt reads a cgroup file holding one integer; "max" is -1.
func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return parseCgroupInt(b)
}

// preadInt reads the integer in the open cgroup file fd (from its start) with buf.
func preadInt(fd int, buf []byte) (int64, error) {
	n, err := unix.Pread(fd, buf, 0)
	if err != nil {
		return 0, err
	}
	return parseCgroupInt(buf[:n])
}

func parseCgroupInt(b []byte) (int64, error) {
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	return strconv.ParseInt(s, 10, 64)
}
