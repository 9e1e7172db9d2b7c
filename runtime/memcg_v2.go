package runtime

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// memcgV2 is the run's cgroup v2 memory cgroup.
//
// Cgroup v2 has no usage thresholds (v1's cgroup.event_control), and of what it offers only one
// thing gives an edge when usage crosses a level of our choosing: memory.high. The kernel checks
// it at every charge batch (64 pages), and a charge over it counts "high" events in
// memory.events (one, and one for each round of reclaim it causes), whose change it announces as a file-modified event (inotify, or poll's
// POLLPRI). The others do not serve: memory.current announces nothing, so watching it is the
// polling this replaces; memory.events moves only at a boundary (low, high, max) or an OOM; a
// PSI trigger fires on time stalled waiting for memory, which a program growing freely below any
// limit never is, so it would fire late or never.
//
// memory.high is a limit, not just a level: above it the kernel makes the charging task reclaim
// the cgroup's memory (page cache, or anonymous memory to swap if there is swap) and, once the
// overage passes about 1 %, sleep in proportion. So it is set only while the programs are below
// it, and lifted (to max) at once when the kernel says they crossed it: listen does, before it
// wakes the rescan loop. Between the crossing and the lift the program is held to the level,
// give or take that 1 %, for as long as farmem takes to react; only what it charges over the
// level in that time is reclaimed. A run crosses its arming level once, and the near-cap level
// only when its memory really falls and rises (nearCapPages).
//
// One level is set at a time, the one the rescan loop asks about (below): the arming threshold
// before arming, nearCapPages after.
//
// The cgroup is a child of farmem's own cgroup. Cgroup v2 lets a cgroup other than the root
// hold processes or enable controllers for its children, not both, so where farmem's cgroup is
// not the root farmem first moves itself into a leaf child of it (farmem-PID.self) and then
// enables +memory in its cgroup.subtree_control, as a service systemd delegates a cgroup to
// (Delegate=yes) must; it does not move processes that are not its own, so a cgroup farmem
// shares (a login shell's session scope) is refused, and the run polls. v2 also places whole
// processes only, so the program cannot be born there from a contained thread, as on v1:
// clone3 starts it in the cgroup (CLONE_INTO_CGROUP, Linux 5.7), and its fork children are born
// there after it.
type memcgV2 struct {
	own     string   // farmem's own cgroup, the run's cgroup's parent
	dir     string   // the run's cgroup, once made; set before the watch is shared
	self    string   // the leaf farmem moved itself into; "" if it did not
	enabled bool     // farmem enabled +memory in own's cgroup.subtree_control
	dirfd   int      // the run's cgroup, for clone3, until leave
	current int      // memory.current, re-read with pread
	events  *os.File // inotify on memory.events, read through the netpoller so close ends listen
	crossed chan struct{}
	buf     [32]byte // below's; only the rescan loop calls it

	mu     sync.Mutex // orders below's and listen's writes of memory.high
	highFd int        // memory.high, open for writing; protected by mu; -1 once closed
	high   int64      // the level memory.high holds (-1: max); protected by mu
}

// newMemcgV2 makes the run's cgroup, sets memory.high at the first of thresholds (the arming
// level) and tells attr to start the program in it.
func newMemcgV2(crossed chan struct{}, attr *syscall.SysProcAttr, thresholds []int64) (m *memcgV2, err error) {
	if attr == nil {
		return nil, errors.New("cgroup v2: the program must be started with clone3 into its cgroup, and no SysProcAttr was given")
	}
	if err := cloneIntoCgroupWorks(); err != nil {
		return nil, err
	}
	own, err := ownCgroupV2()
	if err != nil {
		return nil, err
	}
	if err := hasMemoryController(own); err != nil {
		return nil, err
	}
	sweepUsageWatches(own)
	m = &memcgV2{own: own, dirfd: -1, current: -1, highFd: -1, high: -1, crossed: crossed}
	defer func() {
		if err != nil {
			m.close()
			m = nil
		}
	}()
	if !isRootCgroup(own) && !subtreeHasMemory(own) {
		if err := aloneIn(own); err != nil {
			return m, err
		}
		self := filepath.Join(own, runCgroupName()+".self")
		if err := os.Mkdir(self, 0o755); err != nil {
			return m, err
		}
		m.self = self
		if err := writeCgroup(self, "cgroup.procs", strconv.Itoa(os.Getpid())); err != nil {
			return m, fmt.Errorf("moving farmem into the leaf %s: %w", self, err)
		}
	}
	if !subtreeHasMemory(own) {
		if err := writeCgroup(own, "cgroup.subtree_control", "+memory"); err != nil {
			return m, fmt.Errorf("enabling +memory for the children of %s: %w", own, err)
		}
		m.enabled = true
	}
	dir := filepath.Join(own, runCgroupName())
	if err := os.Mkdir(dir, 0o755); err != nil {
		return m, err
	}
	m.dir = dir
	if m.dirfd, err = unix.Open(m.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return m, err
	}
	if m.current, err = unix.Open(filepath.Join(m.dir, "memory.current"), unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return m, err
	}
	if m.highFd, err = unix.Open(filepath.Join(m.dir, "memory.high"), unix.O_WRONLY|unix.O_CLOEXEC, 0); err != nil {
		return m, err
	}
	ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return m, err
	}
	m.events = os.NewFile(uintptr(ifd), "memory.events") // read through the netpoller, so close ends listen
	if _, err := unix.InotifyAddWatch(ifd, filepath.Join(m.dir, "memory.events"), unix.IN_MODIFY); err != nil {
		return m, err
	}
	if len(thresholds) > 0 {
		m.mu.Lock()
		err = m.setHigh(thresholds[0])
		m.mu.Unlock()
		if err != nil {
			return m, err
		}
	}
	attr.UseCgroupFD, attr.CgroupFD = true, m.dirfd
	go m.listen(m.events)
	return m, nil
}

// listen lifts memory.high and sends on crossed at each change of memory.events, until close.
// The netpoller's slow wakeup is no matter: this is off the fault path and wakes a few times a
// run (the kernel announces a cgroup file's change at most every 20 ms).
func (m *memcgV2) listen(events *os.File) {
	var ev [4096]byte // inotify events; what they say is all the same: memory.events changed
	for {
		if _, err := events.Read(ev[:]); err != nil {
			return
		}
		m.mu.Lock()
		m.setHigh(-1)
		m.mu.Unlock()
		select {
		case m.crossed <- struct{}{}:
		default:
		}
	}
}

// below sets memory.high at threshold when the cgroup is under it (so that crossing it signals
// crossed), and lifts it when not.
func (m *memcgV2) below(threshold int64) bool {
	drain(m.crossed)
	m.mu.Lock()
	defer m.mu.Unlock()
	if threshold <= 0 { // a level at 0 would hold the program to nothing
		m.setHigh(-1)
		return false
	}
	u, err := preadInt(m.current, m.buf[:])
	if err != nil || u >= threshold {
		m.setHigh(-1)
		return false
	}
	if m.high == threshold {
		return true
	}
	if m.setHigh(threshold) != nil {
		return false
	}
	// The kernel sees a level passed at the next charge, not at this write: read again, so a
	// crossing between the two reads is not waited for.
	if u, err := preadInt(m.current, m.buf[:]); err != nil || u >= threshold {
		m.setHigh(-1)
		return false
	}
	return true
}

// setHigh writes level (bytes; -1: max) to memory.high unless it holds it already. m.mu held.
func (m *memcgV2) setHigh(level int64) error {
	if m.highFd < 0 || m.high == level {
		return nil
	}
	v := "max"
	if level >= 0 {
		v = strconv.FormatInt(level, 10)
	}
	if _, err := unix.Pwrite(m.highFd, []byte(v), 0); err != nil {
		m.high = -2 // unknown: the next call writes
		return fmt.Errorf("writing %s to %s/memory.high: %w", v, m.dir, err)
	}
	m.high = level
	return nil
}

// leave: the program was born in the cgroup (clone3); farmem's thread never was in it.
func (m *memcgV2) leave(int) error {
	if m.dirfd >= 0 {
		unix.Close(m.dirfd)
		m.dirfd = -1
	}
	return nil
}

// peak is memory.peak (Linux 5.19 and later).
func (m *memcgV2) peak() (int64, bool) {
	v, err := readInt(filepath.Join(m.dir, "memory.peak"))
	return v, err == nil && v >= 0
}

// close removes the run's cgroup, then, where farmem moved itself into a leaf, turns +memory
// off again if it turned it on and nothing but farmem's cgroups uses it, moves farmem back and
// removes the leaf: farmem's cgroup is left as it found it. The root's +memory stays on (other
// cgroups may count on it by now, as systemd's do).
func (m *memcgV2) close() {
	if m.events != nil {
		m.events.Close() // ends listen
		m.events = nil
	}
	m.mu.Lock()
	if m.highFd >= 0 {
		unix.Close(m.highFd)
		m.highFd = -1
	}
	m.mu.Unlock()
	m.leave(0)
	if m.current >= 0 {
		unix.Close(m.current)
		m.current = -1
	}
	if m.dir != "" {
		unix.Rmdir(m.dir) // peak's reads fail from now on
	}
	if m.self == "" {
		return
	}
	if m.enabled {
		if !onlyChild(m.own, m.self) || writeCgroup(m.own, "cgroup.subtree_control", "-memory") != nil {
			return
		}
		m.enabled = false
	}
	if writeCgroup(m.own, "cgroup.procs", strconv.Itoa(os.Getpid())) != nil {
		return
	}
	unix.Rmdir(m.self)
	m.self = ""
}

// checkMemcgV2 reports what newMemcgV2 would do here, or why it could not, without doing it.
func checkMemcgV2() (how string, err error) {
	if err := cloneIntoCgroupWorks(); err != nil {
		return "", err
	}
	own, err := ownCgroupV2()
	if err != nil {
		return "", err
	}
	if err := hasMemoryController(own); err != nil {
		return "", err
	}
	rel := strings.TrimPrefix(own, cgroupMount)
	if rel == "" {
		rel = "/"
	}
	switch {
	case isRootCgroup(own):
		how = "farmem is in the root cgroup, and a run's cgroup is its child"
	case subtreeHasMemory(own):
		how = fmt.Sprintf("a run's cgroup is a child of farmem's %s", rel)
	default:
		if err := aloneIn(own); err != nil {
			return "", err
		}
		how = fmt.Sprintf("farmem is alone in its cgroup %s: a run moves farmem into a leaf child of it and enables +memory for its children (as systemd's Delegate=yes asks), its program's cgroup beside that leaf, and puts all back as it ends", rel)
	}
	dir := filepath.Join(own, fmt.Sprintf("farmem-check-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("cannot make a cgroup in %s: %w", rel, err)
	}
	unix.Rmdir(dir)
	if !kernelAtLeast(5, 19) {
		how += "; no memory.peak before Linux 5.19, so the summary has no cgroup peak"
	}
	return how, nil
}

// ownCgroupV2 is the directory of farmem's cgroup in the v2 hierarchy (/proc/self/cgroup's
// "0::" line).
func ownCgroupV2() (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			if !strings.HasPrefix(p, "/") || strings.Contains(p, "/..") || strings.HasSuffix(p, " (deleted)") {
				return "", fmt.Errorf("farmem's cgroup %q is outside %s (another cgroup namespace?)", p, cgroupMount)
			}
			return filepath.Join(cgroupMount, p), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("/proc/self/cgroup has no cgroup v2 line (0::)")
}

// hasMemoryController: dir's parent gives it the memory controller (cgroup.controllers).
func hasMemoryController(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return err
	}
	if !slices.Contains(strings.Fields(string(b)), "memory") {
		return fmt.Errorf("farmem's cgroup %s has no memory controller (its parent's cgroup.subtree_control does not enable it)", dir)
	}
	return nil
}

// subtreeHasMemory: dir's children have the memory controller.
func subtreeHasMemory(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	return err == nil && slices.Contains(strings.Fields(string(b)), "memory")
}

// isRootCgroup: dir is the hierarchy's real root (not a cgroup namespace's), the one cgroup
// that may hold processes and enable controllers for its children at once. Only it has no
// cgroup.type.
func isRootCgroup(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "cgroup.type"))
	return errors.Is(err, os.ErrNotExist)
}

// aloneIn: farmem is the only process in dir, so it may move itself out of the way.
func aloneIn(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return err
	}
	var others []string
	for _, p := range strings.Fields(string(b)) {
		if p != strconv.Itoa(os.Getpid()) {
			others = append(others, p)
		}
	}
	if len(others) == 0 {
		return nil
	}
	if len(others) > 4 {
		others = append(others[:4], "...")
	}
	return fmt.Errorf("farmem's cgroup %s holds other processes too (%s), and a v2 cgroup that holds processes cannot enable the memory controller for a child: start farmem in a cgroup of its own (systemd-run --scope -p Delegate=yes farmem run ...)",
		strings.TrimPrefix(dir, cgroupMount), strings.Join(others, " "))
}

// onlyChild: the only cgroup in dir is child.
func onlyChild(dir, child string) bool {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if e.IsDir() && filepath.Join(dir, e.Name()) != child {
			return false
		}
	}
	return true
}

func writeCgroup(dir, file, v string) error {
	return os.WriteFile(filepath.Join(dir, file), []byte(v), 0)
}

// cloneIntoCgroupWorks reports whether clone3 can start a child in a cgroup (CLONE_INTO_CGROUP,
// Linux 5.7). Go's exec does no fallback, so without it the program could not start at all.
// A clone3 with no arguments is refused for its size (EINVAL) where clone3 exists; a seccomp
// filter that forbids clone3 (container runtimes' defaults did) answers ENOSYS.
func cloneIntoCgroupWorks() error {
	if !kernelAtLeast(5, 7) {
		return errors.New("starting a program in a cgroup v2 (clone3's CLONE_INTO_CGROUP) needs Linux 5.7")
	}
	if _, _, e := unix.Syscall(unix.SYS_CLONE3, 0, 0, 0); e == unix.ENOSYS {
		return errors.New("clone3 is refused here (a seccomp filter?): a program cannot be started in a cgroup v2 of its own")
	}
	return nil
}

// kernelAtLeast reports whether the running kernel's version is major.minor or later.
func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var ma, mi int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi)
	return ma > major || ma == major && mi >= minor
}
