package faulttrace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

func readAll(t *testing.T, data []byte, name string) ([]Record, error) {
	t.Helper()
	r, err := NewReader(bytes.NewReader(data), name)
	if err != nil {
		return nil, err
	}
	return r.ReadAll()
}

func TestBinaryRoundTrip(t *testing.T) {
	want := []Record{
		{Time: 0, Pid: 1, Kind: KindRead, Source: SourceZero, Addr: 0x7f0000001000},
		{Time: 12345, Pid: 2, Kind: KindWrite, Source: SourceBackend, Addr: 0x7f0000002abc},
		{Time: math.MaxInt64, Pid: math.MaxUint32, Kind: KindWP, Source: SourceWP, Addr: math.MaxUint64},
		{Time: -1, Pid: 0, Kind: KindUnknown, Source: SourcePrefetchHit, Addr: 0},
	}
	var buf bytes.Buffer
	w, err := NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range want {
		w.Record(r)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if w.Records() != uint64(len(want)) || buf.Len() != len(Magic)+len(want)*RecordSize || !bytes.HasPrefix(buf.Bytes(), []byte("FMTRACE1")) {
		t.Fatalf("%d records, %d bytes: %q...", w.Records(), buf.Len(), buf.Bytes()[:8])
	}
	// The layout is the documented one: little-endian, fields at fixed offsets.
	rec1 := buf.Bytes()[len(Magic)+RecordSize:][:RecordSize]
	if wantBytes := []byte{0x39, 0x30, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 2, 1, 0, 0, 0xbc, 0x2a, 0, 0, 0, 0x7f, 0, 0}; !bytes.Equal(rec1, wantBytes) {
		t.Errorf("record 2 encodes as % x, want % x", rec1, wantBytes)
	}
	got, err := readAll(t, buf.Bytes(), "mem")
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("read back %+v, %v; want %+v", got, err, want)
	}
	if got[1].Page() != 0x7f0000002 {
		t.Errorf("Page() = %#x", got[1].Page())
	}
}

func TestCreateReadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.fmtrace")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w.Record(Record{Pid: 9, Kind: KindRead, Source: SourceBackend, Addr: 0x5000})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	w.Record(Record{Addr: 1}) // after Close: dropped, no panic
	recs, err := ReadFile(path)
	if err != nil || len(recs) != 1 || recs[0].Pid != 9 || recs[0].Page() != 5 {
		t.Fatalf("ReadFile: %+v, %v", recs, err)
	}
	if _, err := Create(filepath.Join(path, "sub")); err == nil || !strings.Contains(err.Error(), "fault trace") {
		t.Errorf("Create under a file: %v", err)
	}
}

func TestTextFormat(t *testing.T) {
	text := "# the paper's first faults\n" +
		"0x48\n" +
		"\n" +
		"   69   # 0x45, in decimal\n" +
		"0X42\r\n" +
		"7 0x3f\n" +
		"0x10 0x3c # pid in hex\n" +
		"\t\n" +
		"12" // no newline at the end
	got, err := readAll(t, []byte(text), "hand.txt")
	want := []Record{
		{Source: SourceBackend, Addr: 0x48 << 12},
		{Source: SourceBackend, Addr: 0x45 << 12},
		{Source: SourceBackend, Addr: 0x42 << 12},
		{Pid: 7, Source: SourceBackend, Addr: 0x3f << 12},
		{Pid: 16, Source: SourceBackend, Addr: 0x3c << 12},
		{Source: SourceBackend, Addr: 12 << 12},
	}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("got %+v, %v\nwant %+v", got, err, want)
	}
	// Text gives page numbers, binary addresses: the same page either way.
	if got[0].Page() != (Record{Addr: 0x48abc}).Page() {
		t.Error("text page 0x48 and address 0x48abc are not the same page")
	}
	for _, empty := range []string{"", "# nothing\n\n"} {
		if got, err := readAll(t, []byte(empty), "e"); err != nil || len(got) != 0 {
			t.Errorf("%q: %v, %v", empty, got, err)
		}
	}
	if got, err := readAll(t, []byte(fmt.Sprint(uint64(MaxPage))), "max"); err != nil || got[0].Page() != MaxPage {
		t.Errorf("the largest page: %v, %v", got, err)
	}
}

func TestBadInput(t *testing.T) {
	var good bytes.Buffer
	w, _ := NewWriter(&good)
	w.Record(Record{Pid: 1, Kind: KindRead, Source: SourceBackend, Addr: 0x1000})
	w.Record(Record{Pid: 1, Kind: KindRead, Source: SourceBackend, Addr: 0x2000})
	w.Close()
	corrupt := bytes.Clone(good.Bytes())
	corrupt[len(Magic)+RecordSize+12] = 9 // record 2's kind
	cases := []struct {
		name, data, want string
	}{
		{"truncated", string(good.Bytes()[:len(Magic)+RecordSize+10]), "t: record 2 is truncated: 10 of 24 bytes"},
		{"corrupt", string(corrupt), "t: record 2 is corrupt: kind 9, source 1"},
		{"version", "FMTRACE2" + strings.Repeat("\x00", 24), `t: trace format version "2" is not supported (this farmem reads FMTRACE1)`},
		{"bad magic", "\x7fELF\x02\x01\x01\x00", "t: bad magic: neither a binary fault trace"},
		{"latin-1", "0x10\n\xe9t\xe9\n", "t: bad magic"},
		{"word", "0x10\n# ok\nsixteen\n", `t:3: cannot parse "sixteen" as a page number (decimal or 0x-hex)`},
		{"negative", "-4\n", `t:1: cannot parse "-4"`},
		{"bad hex", "0x12g\n", `t:1: cannot parse "0x12g"`},
		{"bare 0x", "0x\n", `t:1: cannot parse "0x"`},
		{"underscore", "1_000\n", `t:1: cannot parse "1_000"`},
		{"too large", "0x10000000000000\n", "t:1: page number 0x10000000000000 is too large"},
		{"overflow", "99999999999999999999999\n", "t:1: page number 99999999999999999999999 is too large"},
		{"three fields", "1 2 3\n", "t:1: 3 fields: want a page number, or a pid and a page number"},
		{"bad pid", "4294967296 12\n", `t:1: cannot parse pid "4294967296"`},
	}
	for _, c := range cases {
		_, err := readAll(t, []byte(c.data), "t")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing file: %v", err)
	}
}

// failAfter accepts n bytes, then fails every write.
type failAfter struct{ n int }

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		k := f.n
		f.n = 0
		return k, errors.New("disk full")
	}
	f.n -= len(p)
	return len(p), nil
}

func TestWriteErrorReportedByClose(t *testing.T) {
	w, err := NewWriter(&failAfter{n: 100 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10000 { // 240 KB: the buffer fills and a write fails midway
		w.Record(Record{Addr: uint64(i) << 12})
	}
	if err := w.Close(); err == nil || err.Error() != "disk full" {
		t.Errorf("Close: %v, want the write's error", err)
	}
	if n := w.Records(); n == 0 || n >= 10000 {
		t.Errorf("%d records accepted; want those before the error", n)
	}
	// A flush failing at Close is reported too.
	w, _ = NewWriter(&failAfter{n: 20})
	w.Record(Record{})
	if err := w.Close(); err == nil {
		t.Error("Close did not report the failed flush")
	}
	if _, err := NewWriter(&failAfter{n: 0}); err != nil {
		t.Errorf("the header is buffered: %v", err)
	}
}

// Several fault threads record at once: every record lands whole, each thread's in order.
func TestConcurrentWriters(t *testing.T) {
	const threads, each = 8, 2000
	var buf bytes.Buffer
	w, _ := NewWriter(&buf)
	var wg sync.WaitGroup
	for g := range threads {
		wg.Go(func() {
			for i := range each {
				w.Record(Record{Time: int64(i), Pid: uint32(g), Kind: KindRead, Source: SourceBackend, Addr: uint64(g)<<32 | uint64(i)<<12})
			}
		})
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs, err := readAll(t, buf.Bytes(), "c")
	if err != nil || len(recs) != threads*each {
		t.Fatalf("%d records, %v", len(recs), err)
	}
	next := make([]int64, threads)
	for _, r := range recs {
		if r.Time != next[r.Pid] || r.Addr != uint64(r.Pid)<<32|uint64(r.Time)<<12 {
			t.Fatalf("thread %d: record %+v, want time %d next", r.Pid, r, next[r.Pid])
		}
		next[r.Pid]++
	}
}

func TestRecordDoesNotAllocate(t *testing.T) {
	w, _ := NewWriter(io.Discard)
	r := Record{Time: 1, Pid: 2, Kind: KindRead, Source: SourceBackend, Addr: 0x7f0000001000}
	if n := testing.AllocsPerRun(10000, func() { r.Time++; w.Record(r) }); n != 0 {
		t.Errorf("%v allocations per Record", n)
	}
}

func TestFetched(t *testing.T) {
	for src, want := range map[uint8]bool{SourceZero: false, SourceBackend: true, SourcePrefetchHit: true, SourceWP: false} {
		if (Record{Source: src}).Fetched() != want {
			t.Errorf("source %d: Fetched %v", src, !want)
		}
	}
}
