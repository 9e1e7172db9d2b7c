package faulttrace

import (
	"bytes"
	"io"
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
