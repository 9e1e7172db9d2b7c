package ycsb

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
)

// MemcachedText is memcached's text protocol for the driver (memcachedrive).
type MemcachedText struct {
	data []byte
}

func (*MemcachedText) WriteSet(w *bufio.Writer, k uint64, value []byte) {
	fmt.Fprintf(w, "set key:%d 0 0 %d\r\n", k, len(value))
	w.Write(value)
	w.WriteString("\r\n")
}

func (*MemcachedText) WriteGet(w *bufio.Writer, k uint64) { fmt.Fprintf(w, "get key:%d\r\n", k) }

func (*MemcachedText) ReadSet(r *bufio.Reader, k uint64) error {
	l, err := textLine(r)
	if err != nil {
		return err
	}
	if string(l) != "STORED" {
		return fmt.Errorf("set key:%d: reply %q, want STORED", k, l)
	}
	return nil
}

func (t *MemcachedText) ReadGet(r *bufio.Reader, k uint64) ([]byte, error) {
	l, err := textLine(r)
	if err != nil {
		return nil, err
	}
	if string(l) == "END" {
		return nil, nil
	}
	// VALUE <key> <flags> <bytes>
	f := bytes.Fields(l)
	if len(f) != 4 || string(f[0]) != "VALUE" || string(f[1]) != "key:"+strconv.FormatUint(k, 10) {
		return nil, fmt.Errorf("get key:%d: reply %q", k, l)
	}
	n, err := strconv.Atoi(string(f[3]))
	if err != nil || n < 0 {
		return nil, fmt.Errorf("get key:%d: bad length in %q", k, l)
	}
	t.data = append(t.data[:0], make([]byte, n+2)...)
	if _, err := io.ReadFull(r, t.data); err != nil {
		return nil, fmt.Errorf("reading a value: %w", err)
	}
	if end, err := textLine(r); err != nil || string(end) != "END" {
		return nil, fmt.Errorf("get key:%d: no END after the value (%q, %v)", k, end, err)
	}
	return t.data[:n], nil
}

// textLine reads one reply line, without its CRLF.
func textLine(r *bufio.Reader) ([]byte, error) {
	l, err := r.ReadSlice('\n')
	if err != nil {
		return nil, fmt.Errorf("reading a reply: %w", err)
	}
	if len(l) < 2 || l[len(l)-2] != '\r' {
		return nil, fmt.Errorf("malformed reply line %q", l)
	}
	return l[:len(l)-2], nil
}
