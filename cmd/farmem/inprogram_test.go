package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/pubtable"
)

// The words farmem keeps for a program's agent (package pubtable) say only what is true, read
// from outside as the agent reads them, while micro pages under a cap of a quarter of its
// footprint and the agent serves its faults: every page of micro's memory has a word once micro has filled it (None would let
// the agent zero-fill a page with data), and every Published word names a page of the store
// space that holds that very page of micro's, read between two equal reads of the word as the
// agent's claim does. micro's pages hold their own index in every word, so a word that names
// another page's copy, or a freed one, shows.
func TestPublishedWordsNameTheirPages(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	const pages = 64 << 20 >> 12
	cmd := exec.Command(farmemBin(t), "run", "--local-mem", "16MiB", "--serve-faults", "program", "--",
		filepath.Join(binDir, "micro"), "--mib", "64", "--pattern", "random", "--passes", "1000000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}()
	filled := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "micro: fill ") {
				filled <- true
			}
		}
		close(filled)
	}()
	select {
	case ok := <-filled:
		if !ok {
			t.Fatalf("micro ended before its fill: %s", stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("micro did not fill its memory in 60 s: %s", stderr.String())
	}

	farmem := cmd.Process.Pid
	micro := childNamed(t, farmem, "micro")
	start := mappingOfSize(t, micro, pages*4096)
	table := farmemMemfd(t, farmem, "farmem-table")
	defer table.Close()
	store := farmemMemfd(t, farmem, "farmem-store")
	defer store.Close()

	// micro's words, mapped as the agent maps the table.
	first := start >> 12 * 8
	off := first &^ 4095
	b, err := unix.Mmap(int(table.Fd()), int64(off), int(first-off)+pages*8, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	words := unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(&b[first-off])), pages)

	page := make([]byte, 4096)
	verified := 0
	for sample := 0; sample < 40; sample++ {
		for i := range words {
			w := words[i].Load()
			switch pubtable.KindOf(w) {
			case pubtable.None:
				t.Fatalf("page %d of micro's (%#x), which micro wrote, has no word: the agent would zero-fill it", i, start+uint64(i)*4096)
			case pubtable.Published:
			default:
				continue
			}
			if _, err := store.ReadAt(page, pubtable.Offset(w)); err != nil {
				t.Fatalf("page %d's word names offset %#x of the store: %v", i, pubtable.Offset(w), err)
			}
			if words[i].Load() != w {
				continue // withdrawn meanwhile: the agent's claim would have failed
			}
			if bad := microPageBad(page, uint64(i)); bad != "" {
				t.Fatalf("page %d of micro's is published at store offset %#x, which holds %s", i, pubtable.Offset(w), bad)
			}
			verified++
		}
		time.Sleep(50 * time.Millisecond)
	}
	if verified < pages {
		t.Fatalf("only %d published pages read over 40 samples of %d pages under a cap of a quarter: publishing stopped?", verified, pages)
	}
	t.Logf("%d published pages read and verified", verified)
}

// microPageBad says what is wrong with page, which should be micro's page i: each 8-byte word w
// holds i<<8 | w<<32 | the page's pass number.
func microPageBad(page []byte, i uint64) string {
	gen := binary.LittleEndian.Uint64(page) & 0xff
	for w := uint64(0); w < 512; w++ {
		v := binary.LittleEndian.Uint64(page[w*8:])
		if want := i<<8 | w<<32 | gen; v != want {
			return fmt.Sprintf("%#x at word %d (micro's page %d would hold %#x)", v, w, i, want)
		}
	}
	return ""
}

// childNamed returns the pid of parent's child whose command is name.
func childNamed(t *testing.T, parent int, name string) int {
	t.Helper()
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", parent))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(s)
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == name {
				return pid
			}
		}
	}
	t.Fatalf("no child %q of %d", name, parent)
	return 0
}

// mappingOfSize returns the start of pid's one mapping of size bytes.
func mappingOfSize(t *testing.T, pid int, size uint64) uint64 {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	var found []uint64
	for _, l := range strings.Split(string(maps), "\n") {
		var lo, hi uint64
		if _, err := fmt.Sscanf(l, "%x-%x", &lo, &hi); err == nil && hi-lo == size {
			found = append(found, lo)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d mappings of %d bytes in %d, want 1:\n%s", len(found), size, pid, maps)
	}
	return found[0]
}

// farmemMemfd opens farmem's one memfd named name, through /proc.
func farmemMemfd(t *testing.T, pid int, name string) *os.File {
	t.Helper()
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	var found []string
	for _, fd := range fds {
		if l, _ := os.Readlink(fd); strings.HasPrefix(l, "/memfd:"+name+" ") {
			found = append(found, fd)
		}
	}
	if len(found) != 1 {
		t.Fatalf("farmem holds %d memfds named %s, want 1", len(found), name)
	}
	f, err := os.Open(found[0])
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// With --serve-faults program the faults on evicted pages that follow no trend are served in the
// program, the rest by farmem (and its prefetcher), and every page comes back whole: torture's
// units (random rewrites, realloc, a verifying fork child) check every byte, under a cap of about
// a third of what it touches. With --serve-faults farmem (the default), farmem serves every
// fault itself.
func TestFaultsServedInProgram(t *testing.T) {
	for _, where := range []string{"program", "farmem"} {
		t.Run(where, func(t *testing.T) {
			s, peaks := runTorture(t, 24, []string{"--serve-faults", where}, "--mib", "64", "--rounds", "3")
			checkCap(t, s, peaks, 24<<20)
			back := s.BytesIn / 4096
			switch {
			case where == "farmem" && s.InProgram != 0:
				t.Fatalf("%d faults served in the program with --serve-faults farmem", s.InProgram)
			case where == "program" && s.InProgram*10 < s.InProgram+back:
				t.Fatalf("%d faults served in the program, %d pages read back by farmem: under a tenth in the program", s.InProgram, back)
			}
			t.Logf("served in the program: %d; read back by farmem: %d", s.InProgram, back)
		})
	}
}

// --serve-faults takes farmem or program, and says so.
func TestServeFaultsBadValue(t *testing.T) {
	out, err := exec.Command(farmemBin(t), "run", "--local-mem", "16MiB", "--serve-faults", "kernel", "--", "true").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 125 || !strings.Contains(string(out), `--serve-faults "kernel": give farmem or program`) {
		t.Fatalf("--serve-faults kernel: %v\n%s; want exit 125 naming the two values", err, out)
	}
}
