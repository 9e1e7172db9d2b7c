package faulttrace

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// The reader never panics or loops on any input: it returns records, io.EOF or an error.
func FuzzReader(f *testing.F) {
	var bin bytes.Buffer
	w, _ := NewWriter(&bin)
	w.Record(Record{Time: 5, Pid: 1, Kind: KindRead, Source: SourceBackend, Addr: 0x1000})
	w.Close()
	for _, seed := range [][]byte{bin.Bytes(), bin.Bytes()[:20], []byte("0x10\n# c\n7 12\n"), []byte("FMTRACE9"), {0, 1, 2}, []byte("1 2 3\n")} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := NewReader(bytes.NewReader(data), "fuzz")
		if err != nil {
			return
		}
		for range len(data) + 1 {
			rec, err := r.Next()
			if err != nil {
				return
			}
			if !r.Binary() && rec.Page() > MaxPage {
				t.Fatalf("page %#x", rec.Page())
			}
		}
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("more records than bytes: %v", err)
		}
	})
}

// Reading an access stream never panics on any input, and what it returns is consistent: every
// access names a page it numbered, and a page stream has a write bit for each access.
func FuzzAccesses(f *testing.F) {
	for _, seed := range [][]byte{pageStream(1, 2|PagesWrote, 1), pageStream(1)[:12], []byte("0x10\n7 12\n"), []byte(Magic), []byte("FMPAGES0"), {0, 1, 2}} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := NewAccesses(bytes.NewReader(data), "fuzz")
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("a multi-line error: %q", err)
			}
			return
		}
		for _, id := range a.Seq {
			if int(id) >= a.Distinct() {
				t.Fatalf("access to page %d of %d", id, a.Distinct())
			}
		}
		if a.Writes != nil && len(a.Writes) != (len(a.Seq)+63)/64 {
			t.Fatalf("%d write words for %d accesses", len(a.Writes), len(a.Seq))
		}
	})
}
