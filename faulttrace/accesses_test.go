package faulttrace

import (
	"bytes"
	"container/list"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// pageStream encodes pages in the page stream format.
func pageStream(pages ...uint64) []byte {
	b := []byte(PagesMagic)
	for _, p := range pages {
		b = binary.LittleEndian.AppendUint64(b, p)
	}
	return b
}

// Belady's anomaly sequence: 5 distinct pages, the classic textbook counts (misses, first
// touches included): FIFO 9 at 3 frames and 10 at 4, LRU 10 and 8, MIN 7 and 6.
var beladySeq = []uint64{1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5}

func TestReadAccessesPageStream(t *testing.T) {
	a, err := NewAccesses(bytes.NewReader(pageStream(0x7f0000001, 0x10, 0x7f0000001, MaxPage)), "s")
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Seq) != 4 || a.Distinct() != 3 || a.Seq[0] != a.Seq[2] || a.Pages[a.Seq[1]].Page != 0x10 || a.Pages[a.Seq[3]].Page != MaxPage {
		t.Fatalf("read %+v", a)
	}
}

func TestReadAccessesText(t *testing.T) {
	a, err := NewAccesses(strings.NewReader("# pid page\n7 0x10\n8 0x10\n7 16\n"), "t")
	if err != nil {
		t.Fatal(err)
	}
	// The same page number in two processes is two pages.
	if len(a.Seq) != 3 || a.Distinct() != 2 || a.Seq[0] != a.Seq[2] || a.Pages[a.Seq[1]] != (Page{Pid: 8, Page: 0x10}) {
		t.Fatalf("read %+v", a)
	}
}

func TestReadAccessesBadInput(t *testing.T) {
	faults := bytes.NewBufferString(Magic)
	faults.Write(make([]byte, RecordSize))
	cases := []struct {
		name string
		in   []byte
		want string
	}{
		{"fault trace", faults.Bytes(), "s is a fault trace (FMTRACE1), not an access stream: it holds only the faults"},
		{"truncated", append(pageStream(1, 2), 3, 0, 0), "s: access 3 is truncated: 3 of 8 bytes"},
		{"corrupt", pageStream(1, MaxPage+1), "s: access 2 is corrupt: page number 0x10000000000000 is past"},
		{"version", []byte("FMPAGES2" + "12345678"), `s: page stream format version "2" is not supported`},
		{"empty stream", pageStream(), "s holds no accesses"},
		{"empty text", []byte("# none\n"), "s holds no accesses"},
		{"bad text", []byte("0x10\nx\n"), `s:2: cannot parse "x" as a page number`},
		{"binary junk", []byte{0, 1, 2, 3, 4, 5, 6, 7, 8}, "s: bad magic"},
	}
	for _, c := range cases {
		_, err := NewAccesses(bytes.NewReader(c.in), "s")
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want a one-line error with %q", c.name, err, c.want)
		}
	}
}

func accessesOf(t *testing.T, pages []uint64) *Accesses {
	t.Helper()
	a, err := NewAccesses(bytes.NewReader(pageStream(pages...)), "s")
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestLRUAndMINTextbook(t *testing.T) {
	a := accessesOf(t, beladySeq)
	for _, c := range []struct{ frames, lru, min int }{{3, 10, 7}, {4, 8, 6}, {5, 5, 5}, {1, 12, 12}} {
		l, m := LRU(a, c.frames), MIN(a, c.frames)
		if l.Cold != 5 || m.Cold != 5 || int(l.Cold+l.Refaults) != c.lru || int(m.Cold+m.Refaults) != c.min {
			t.Errorf("%d frames: LRU %+v MIN %+v, want %d and %d misses, 5 cold", c.frames, l, m, c.lru, c.min)
		}
	}
}

// refLRU and refMIN are the definitions, written the slow obvious way.
func refLRU(seq []uint64, frames int) int {
	l, at, misses := list.New(), map[uint64]*list.Element{}, 0
	for _, p := range seq {
		if el, ok := at[p]; ok {
			l.MoveToFront(el)
			continue
		}
		misses++
		at[p] = l.PushFront(p)
		if l.Len() > frames {
			delete(at, l.Remove(l.Back()).(uint64))
		}
	}
	return misses
}

func refMIN(seq []uint64, frames int) int {
	in, misses := map[uint64]bool{}, 0
	for i, p := range seq {
		if in[p] {
			continue
		}
		misses++
		if len(in) == frames {
			far, victim := -1, uint64(0)
			for q := range in {
				next := len(seq) // never used again: furthest
				for j := i + 1; j < len(seq); j++ {
					if seq[j] == q {
						next = j
						break
					}
				}
				if next > far || next == far && q < victim {
					far, victim = next, q
				}
			}
			delete(in, victim)
		}
		in[p] = true
	}
	return misses
}

// On random streams, skewed and not, LRU and MIN count what their definitions do, and MIN never
// misses more than LRU. The streams are long enough for MIN's heap to be rebuilt.
func TestLRUAndMINAgainstDefinitions(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 30 {
		pages := 2 + r.IntN(60)
		seq := make([]uint64, 1500+r.IntN(1500))
		for i := range seq {
			if round%2 == 0 {
				seq[i] = uint64(r.IntN(pages))
			} else {
				seq[i] = uint64(r.IntN(1 + r.IntN(pages))) // low pages hotter
			}
		}
		a := accessesOf(t, seq)
		for _, frames := range []int{1, 2, pages / 3, pages / 2, pages - 1, pages + 1} {
			if frames < 1 {
				continue
			}
			l, m := LRU(a, frames), MIN(a, frames)
			wl, wm := refLRU(seq, frames), refMIN(seq, frames)
			if int(l.Cold+l.Refaults) != wl || int(m.Cold+m.Refaults) != wm || m.Refaults > l.Refaults || l.Cold != uint64(a.Distinct()) {
				t.Fatalf("round %d, %d pages, %d frames: LRU %+v (want %d misses), MIN %+v (want %d)", round, pages, frames, l, wl, m, wm)
			}
		}
	}
}

// A page stream's bit 63 marks the accesses that wrote; a text stream has no write bits.
func TestReadAccessesWrites(t *testing.T) {
	pages := make([]uint64, 130)
	for i := range pages {
		pages[i] = uint64(i % 7)
		if i%3 == 0 {
			pages[i] |= PagesWrote
		}
	}
	a := accessesOf(t, pages)
	if a.Distinct() != 7 {
		t.Fatalf("%d pages, want 7: the write bit is not part of the page", a.Distinct())
	}
	for i := range pages {
		if a.Wrote(i) != (i%3 == 0) || a.Pages[a.Seq[i]].Page != uint64(i%7) {
			t.Fatalf("access %d: page %#x wrote %v", i, a.Pages[a.Seq[i]].Page, a.Wrote(i))
		}
	}
	txt, err := NewAccesses(strings.NewReader("1\n2\n"), "t")
	if err != nil || txt.Writes != nil || txt.Wrote(1) {
		t.Fatalf("text stream: %+v, %v: want no write bits", txt, err)
	}
}

// refClock is second-chance FIFO, the definition: a circular scan with a use bit.
func refClock(seq []uint64, marks []bool, frames int) int {
	var q []uint64
	bit := map[uint64]bool{}
	misses := 0
	for i, p := range seq {
		if slices.Contains(q, p) {
			bit[p] = bit[p] || marks[i]
			continue
		}
		misses++
		if len(q) == frames {
			for bit[q[0]] {
				bit[q[0]] = false
				q = append(q[1:], q[0])
			}
			delete(bit, q[0])
			q = q[1:]
		}
		q = append(q, p)
		bit[p] = marks[i]
	}
	return misses
}

// Clock against its definition, marked by every access (the accessed bit: between LRU and
// FIFO here, never below MIN), by none (FIFO), and by the writes.
func TestClockAgainstDefinition(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for round := range 20 {
		pages := 3 + r.IntN(50)
		seq, raw := make([]uint64, 3000), make([]uint64, 3000)
		writes := make([]bool, len(seq))
		for i := range seq {
			seq[i] = uint64(r.IntN(1 + r.IntN(pages)))
			raw[i] = seq[i]
			if writes[i] = r.IntN(4) == 0; writes[i] {
				raw[i] |= PagesWrote
			}
		}
		a := accessesOf(t, raw)
		all, none := make([]bool, len(seq)), make([]bool, len(seq))
		for i := range all {
			all[i] = true
		}
		for _, frames := range []int{1, 2, pages / 2, pages - 1} {
			if frames < 1 {
				continue
			}
			for name, marks := range map[string][]bool{"accessed": all, "none": none, "written": writes} {
				got := Clock(a, frames, func(i int) bool { return marks[i] })
				if want := refClock(seq, marks, frames); int(got.Cold+got.Refaults) != want {
					t.Fatalf("round %d, %d frames, %s bits: %+v, want %d misses", round, frames, name, got, want)
				}
			}
			if c, m := Clock(a, frames, a.Wrote), MIN(a, frames); c.Refaults < m.Refaults {
				t.Fatalf("round %d: clock on written bits %+v below MIN %+v", round, c, m)
			}
		}
	}
}
