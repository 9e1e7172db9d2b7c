// Package procfs reads what farmem needs of /proc: a process's resident anonymous pages
// (statm), its mappings (maps), which of its pages are present (pagemap), whether any mapping
// is registered with a userfaultfd (smaps), the CPU a thread last ran on, the process a
// thread belongs to and a process's sizes (stat, status), and the cgroup a controller puts
// farmem in (/proc/self/cgroup).
//
// It only reads and parses: no policy (which mappings farmem registers is package runtime's
// call), no state beyond an open file, no goroutine. A process that has exited reads as an
// error from the open or the read (ENOENT, ESRCH), which callers take as "gone".
package procfs

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// PageSize is the page size of pagemap's entries.
const PageSize = 4096

// Statm reads one process's resident anonymous pages from /proc/PID/statm. The file is opened
// once and re-read with pread: the kernel regenerates it on every read from offset 0, and a
// pread is one system call where open, read and close are three (the runtime reads it every
// few milliseconds while a program runs near its cap).
type Statm struct {
	fd  int
	buf [128]byte
}

// OpenStatm opens pid's statm.
func OpenStatm(pid int) (*Statm, error) {
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/statm", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &Statm{fd: fd}, nil
}

// AnonPages returns the resident pages that are not shared with a file (resident - shared: the
// second and third fields), or 0 once the process is gone.
func (s *Statm) AnonPages() int64 {
	n, err := unix.Pread(s.fd, s.buf[:], 0)
	if err != nil || n <= 0 {
		return 0
	}
	f := s.buf[:n]
	var fields [3]int64
	for i := range fields {
		for len(f) > 0 && f[0] == ' ' {
			f = f[1:]
		}
		for len(f) > 0 && f[0] >= '0' && f[0] <= '9' {
			fields[i] = fields[i]*10 + int64(f[0]-'0')
			f = f[1:]
		}
	}
	return fields[1] - fields[2]
}

// Close closes the file.
func (s *Statm) Close() error { return unix.Close(s.fd) }

// Mapping is one line of /proc/PID/maps.
type Mapping struct {
	Start, End uint64
	Perms      string // "rw-p", "---p", "r-xp", ...
	Offset     uint64
	Inode      uint64
	Path       string // "" for anonymous memory; "[heap]", "[stack]", a file
}

// ParseMapsLine parses one line of /proc/PID/maps.
func ParseMapsLine(line string) (m Mapping, ok bool) {
	f := strings.Fields(line)
	if len(f) < 5 {
		return m, false
	}
	start, end, found := strings.Cut(f[0], "-")
	var err [4]error
	m.Start, err[0] = strconv.ParseUint(start, 16, 64)
	m.End, err[1] = strconv.ParseUint(end, 16, 64)
	m.Offset, err[2] = strconv.ParseUint(f[2], 16, 64)
	m.Inode, err[3] = strconv.ParseUint(f[4], 10, 64)
	if !found || err != [4]error{} {
		return Mapping{}, false
	}
	m.Perms = f[1]
	if len(f) >= 6 {
		m.Path = strings.Join(f[5:], " ")
	}
	return m, true
}

// Maps calls fn with each mapping of pid, in address order.
func Maps(pid int, fn func(Mapping)) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m, ok := ParseMapsLine(sc.Text()); ok {
			fn(m)
		}
	}
	return sc.Err()
}

// Pagemap reads the /proc/PID/pagemap entries of len(out) pages from address start.
func Pagemap(pid int, start uint64, out []uint64) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return err
	}
	defer f.Close()
	b := make([]byte, 8*len(out))
	if _, err := f.ReadAt(b, int64(start/PageSize*8)); err != nil {
		return err
	}
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return nil
}

// Present reports whether a pagemap entry says its page is present in memory (bit 63).
func Present(entry uint64) bool { return entry>>63 != 0 }

// PagePresent reports whether the page at addr is present in pid's memory.
func PagePresent(pid int, addr uint64) (bool, error) {
	var e [1]uint64
	if err := Pagemap(pid, addr, e[:]); err != nil {
		return false, err
	}
	return Present(e[0]), nil
}

// ThreadCPU returns the CPU thread tid of pid last ran on (field 39 of its stat).
func ThreadCPU(pid, tid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/stat", pid, tid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: count from its last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("unparsable stat of %d/%d", pid, tid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 37 {
		return 0, fmt.Errorf("short stat of %d/%d", pid, tid)
	}
	return strconv.Atoi(f[36])
}

// ThreadRan returns the time thread tid of pid has spent on a CPU, in ns: the first field of its
// schedstat.
func ThreadRan(pid, tid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/schedstat", pid, tid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 0, fmt.Errorf("empty schedstat of %d/%d", pid, tid)
	}
	return strconv.ParseInt(f[0], 10, 64)
}

// Threads returns the thread ids of pid.
func Threads(pid int) ([]int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, len(tasks))
	for _, t := range tasks {
		if tid, err := strconv.Atoi(t.Name()); err == nil {
			out = append(out, tid)
		}
	}
	return out, nil
}

// Children returns the pids of pid's children: those each of its threads started (the kernel
// lists a child under the thread that made it).
func Children(pid int) ([]int, error) {
	tids, err := Threads(pid)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, tid := range tids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, tid))
		if err != nil {
			continue // the thread ended
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// Tgid returns the process (thread group) thread tid belongs to.
func Tgid(tid int) (int, error) { return statusInt(tid, "Tgid") }

// PPid returns the pid of process pid's parent.
func PPid(pid int) (int, error) { return statusInt(pid, "PPid") }

// TracerPid returns the thread tracing process pid (0: none).
func TracerPid(pid int) (int, error) { return statusInt(pid, "TracerPid") }

// statusInt returns a whole-number field of pid's status.
func statusInt(pid int, field string) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("no %s in the status of %d", field, pid)
}

// StatusBytes returns a size field of pid's status (VmRSS, VmHWM, RssAnon, ...), which the
// kernel gives in kB, in bytes; pid 0 is this process.
func StatusBytes(pid int, field string) (int64, error) {
	path := "/proc/self/status"
	if pid != 0 {
		path = "/proc/" + strconv.Itoa(pid) + "/status"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("unparsable %s in %s: %q", field, path, v)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no %s in %s", field, path)
}

// OwnCgroup returns the path, within its hierarchy, of the cgroup v1 hierarchy holding
// controller that this process is in (from /proc/self/cgroup). fs.ErrNotExist: no v1 hierarchy
// has that controller.
func OwnCgroup(controller string) (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), controller) {
			return parts[2], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("no cgroup v1 %s controller: %w", controller, fs.ErrNotExist)
}
