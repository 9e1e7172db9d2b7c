// Package faulttrace reads and writes fault traces: one record per page fault a farmem run
// served, for replaying through prefetchers offline (`farmem sim`, prefetch.Replayer).
//
// # Binary format
//
// `farmem run --record-faults FILE` writes the binary format: the 8-byte header "FMTRACE1"
// (magic and version in one: a change to the record is a new version), then fixed-size
// 24-byte records, little-endian:
//
//	offset size field
//	0      8    Time    int64  nanoseconds since the run started
//	8      4    Pid     uint32 the faulting process
//	12     1    Kind    uint8  0 unknown, 1 read, 2 write, 3 write-protect
//	13     1    Source  uint8  how it was served: 0 zero-fill (first touch), 1 backend (far
//	                           memory), 2 prefetch-cache hit, 3 write-protect (dirty tracking)
//	14     2    reserved, written 0, ignored
//	16     8    Addr    uint64 the faulting byte address
//
// # Text format
//
// Anyone can write a trace by hand: one fault per line, a page number in decimal or 0x-hex
// ("4660" or "0x1234"), optionally preceded by a pid ("42 0x1234"; pid 0 if absent). Blank
// lines and everything after a '#' are ignored. A text trace holds page numbers (address >>
// 12), not addresses: 0x1234 in a text trace is the page at address 0x1234000, the same page
// a binary record with Addr 0x1234000 (or 0x1234abc) names. Text records have Time 0, Kind 0
// (unknown) and Source 1 (backend): every line is a fault that needed a fetch.
//
// Reader tells the formats apart by the header, so every tool takes either.
package faulttrace

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// Magic starts every binary trace; its last byte is the format version.
const Magic = "FMTRACE1"

// RecordSize is the size of one binary record.
const RecordSize = 24

// PageShift converts between addresses and page numbers: page = address >> PageShift.
const PageShift = 12

// MaxPage is the largest page number a text trace may give: its address must fit 64 bits.
const MaxPage = math.MaxUint64 >> PageShift

// Kinds of fault (Record.Kind).
const (
	KindUnknown uint8 = 0 // not recorded (text traces)
	KindRead    uint8 = 1
	KindWrite   uint8 = 2
	KindWP      uint8 = 3 // a write to a write-protected page (dirty tracking)
)

// Sources: how the runtime served a fault (Record.Source).
const (
	SourceZero        uint8 = 0 // a first touch, zero-filled: nothing fetched
	SourceBackend     uint8 = 1 // fetched from far memory (the backend)
	SourcePrefetchHit uint8 = 2 // served from the prefetch cache
	SourceWP          uint8 = 3 // a write-protect fault: the page was present, marked dirty
)

// Record is one fault.
type Record struct {
	Time   int64  // nanoseconds since the run started (0 in text traces)
	Pid    uint32 // the faulting process
	Kind   uint8  // KindRead, KindWrite, KindWP or KindUnknown
	Source uint8  // SourceZero, SourceBackend, SourcePrefetchHit or SourceWP
	Addr   uint64 // the faulting byte address
}

// Page returns the record's page number (Addr >> 12), what prefetchers take.
func (r Record) Page() uint64 { return r.Addr >> PageShift }

// Fetched reports whether the fault needed the page's contents from far memory or the
// prefetch cache: the faults a prefetcher sees and is scored on. First touches and
// write-protect faults are not.
func (r Record) Fetched() bool {
	return r.Source == SourceBackend || r.Source == SourcePrefetchHit
}

func (r Record) encode(b *[RecordSize]byte) {
	binary.LittleEndian.PutUint64(b[0:], uint64(r.Time))
	binary.LittleEndian.PutUint32(b[8:], r.Pid)
	b[12], b[13], b[14], b[15] = r.Kind, r.Source, 0, 0
	binary.LittleEndian.PutUint64(b[16:], r.Addr)
}

func decode(b []byte) Record {
	return Record{
		Time:   int64(binary.LittleEndian.Uint64(b[0:])),
		Pid:    binary.LittleEndian.Uint32(b[8:]),
		Kind:   b[12],
		Source: b[13],
		Addr:   binary.LittleEndian.Uint64(b[16:]),
	}
}

// Writer writes a binary trace. Record is safe for concurrent use by several fault threads
// and does not allocate; records from different threads interleave in the order they get the
// writer's lock.
type Writer struct {
	mu     sync.Mutex
	bw     *bufio.Writer    // buffers records; guarded by mu
	file   io.Closer        // closed by Close when the Writer opened it (Create), else nil
	buf    [RecordSize]byte // one encoded record; guarded by mu
	err    error            // the first write error, sticky; guarded by mu
	closed bool             // Close was called; guarded by mu
	n      uint64           // records accepted; guarded by mu
}

// NewWriter writes the header to w and returns a Writer appending records to it. Close
// flushes but does not close w.
func NewWriter(w io.Writer) (*Writer, error) {
	bw := bufio.NewWriterSize(w, 64<<10)
	if _, err := bw.WriteString(Magic); err != nil {
		return nil, err
	}
	return &Writer{bw: bw}, nil
}

// Create creates (or truncates) the file path and returns a Writer to it; Close closes it.
func Create(path string) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("fault trace: %w", err)
	}
	w, err := NewWriter(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("fault trace %s: %w", path, err)
	}
	w.file = f
	return w, nil
}

// Record appends one record. A write error is kept for Close to report; records after it
// (or after Close) are dropped: tracing must never stop the fault path.
func (w *Writer) Record(r Record) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil || w.closed {
		return
	}
	r.encode(&w.buf)
	if _, err := w.bw.Write(w.buf[:]); err != nil {
		w.err = err
		return
	}
	w.n++
}

// Records returns how many records were accepted so far.
func (w *Writer) Records() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// Close flushes the buffered records, closes the file if Create opened it, and returns the
// first error of any write, the flush or the close. Closing twice returns nil the second
// time.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	err := w.err
	if ferr := w.bw.Flush(); err == nil {
		err = ferr
	}
	if w.file != nil {
		if cerr := w.file.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// Reader reads a trace in either format, one record at a time.
type Reader struct {
	file   io.Closer     // closed by Close when Open opened it, else nil
	name   string        // the file's name, for errors
	br     *bufio.Reader // the trace after the header (binary) or from the start (text)
	binary bool          // which format
	n      uint64        // records read so far (binary)
	line   int           // lines read so far (text)
	buf    [RecordSize]byte
}

// NewReader returns a Reader of r; name (a file name) prefixes its errors. It reads enough to
// tell the formats apart.
func NewReader(r io.Reader, name string) (*Reader, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	head, err := br.Peek(len(Magic))
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	rd := &Reader{name: name, br: br}
	switch {
	case string(head) == Magic:
		rd.binary = true
		br.Discard(len(Magic))
	case len(head) == len(Magic) && string(head[:len(Magic)-1]) == Magic[:len(Magic)-1]:
		return nil, fmt.Errorf("%s: trace format version %q is not supported (this farmem reads %s)", name, head[len(Magic)-1:], Magic)
	default:
		// Not our header: it must be text. Refuse binary data here rather than report it as
		// an unparsable first line.
		sniff, _ := br.Peek(512)
		if bytes.IndexByte(sniff, 0) >= 0 || !utf8.Valid(trimPartialRune(sniff)) {
			return nil, fmt.Errorf("%s: bad magic: neither a binary fault trace (it starts with %s) nor a text one (page numbers, one a line)", name, Magic)
		}
	}
	return rd, nil
}

// trimPartialRune drops a UTF-8 sequence cut short by the end of a peek.
func trimPartialRune(b []byte) []byte {
	for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			break
		}
	}
	return b
}

// Binary reports whether the trace is in the binary format.
func (r *Reader) Binary() bool { return r.binary }

// Next returns the next record, or io.EOF after the last one. Other errors name the file
// and the record (binary) or line (text) at fault.
func (r *Reader) Next() (Record, error) {
	if r.binary {
		return r.nextBinary()
	}
	return r.nextText()
}

func (r *Reader) nextBinary() (Record, error) {
	n, err := io.ReadFull(r.br, r.buf[:])
	switch {
	case err == io.EOF:
		return Record{}, io.EOF
	case err == io.ErrUnexpectedEOF:
		return Record{}, fmt.Errorf("%s: record %d is truncated: %d of %d bytes", r.name, r.n+1, n, RecordSize)
	case err != nil:
		return Record{}, fmt.Errorf("%s: record %d: %w", r.name, r.n+1, err)
	}
	r.n++
	rec := decode(r.buf[:])
	if rec.Kind > KindWP || rec.Source > SourceWP {
		return Record{}, fmt.Errorf("%s: record %d is corrupt: kind %d, source %d (each 0 to 3)", r.name, r.n, rec.Kind, rec.Source)
	}
	return rec, nil
}

func (r *Reader) nextText() (Record, error) {
	for {
		line, err := r.br.ReadString('\n')
		if line == "" && err != nil {
			if err == io.EOF {
				return Record{}, io.EOF
			}
			return Record{}, fmt.Errorf("%s:%d: %w", r.name, r.line+1, err)
		}
		r.line++
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		var pid uint64
		switch len(fields) {
		case 0:
			continue
		case 1:
		case 2:
			p, err := parseNumber(fields[0], 32)
			if err != nil {
				return Record{}, fmt.Errorf("%s:%d: cannot parse pid %q (decimal or 0x-hex, below 2^32)", r.name, r.line, fields[0])
			}
			pid = p
		default:
			return Record{}, fmt.Errorf("%s:%d: %d fields: want a page number, or a pid and a page number", r.name, r.line, len(fields))
		}
		page, err := parsePage(fields[len(fields)-1])
		if err != nil {
			return Record{}, fmt.Errorf("%s:%d: %v", r.name, r.line, err)
		}
		return Record{Pid: uint32(pid), Source: SourceBackend, Addr: page << PageShift}, nil
	}
}

// parseNumber reads an unsigned number of bits bits in decimal or 0x-hex.
func parseNumber(s string, bits int) (uint64, error) {
	base, digits := 10, s
	if len(s) > 2 && (s[:2] == "0x" || s[:2] == "0X") {
		base, digits = 16, s[2:]
	}
	return strconv.ParseUint(digits, base, bits) // no sign, no '_': base is not 0
}

// parsePage reads a page number in decimal or 0x-hex.
func parsePage(s string) (uint64, error) {
	page, err := parseNumber(s, 64)
	if errors.Is(err, strconv.ErrRange) || err == nil && page > MaxPage {
		return 0, fmt.Errorf("page number %s is too large: page numbers are addresses >> 12, at most %#x", s, uint64(MaxPage))
	}
	if err != nil {
		return 0, fmt.Errorf("cannot parse %q as a page number (decimal or 0x-hex)", s)
	}
	return page, nil
}

// Open opens the trace at path, in either format, for reading record by record.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	r, err := NewReader(f, path)
	if err != nil {
		f.Close()
		return nil, err
	}
	r.file = f
	return r, nil
}

// Close closes the file Open opened; for a Reader from NewReader it does nothing.
func (r *Reader) Close() error {
	if r.file == nil {
		return nil
	}
	return r.file.Close()
}

// ReadFile reads the whole trace at path, in either format.
func ReadFile(path string) ([]Record, error) {
	r, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.ReadAll()
}

// ReadAll reads the rest of the trace.
func (r *Reader) ReadAll() ([]Record, error) {
	var recs []Record
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return recs, nil
		}
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
}
