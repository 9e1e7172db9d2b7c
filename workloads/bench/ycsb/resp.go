package ycsb

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
)

// RESP is redis's protocol (RESP2) for the driver (redisdrive).
type RESP struct {
	buf, key, data []byte
}

func (c *RESP) command(w *bufio.Writer, args ...[]byte) {
	c.buf = c.buf[:0]
	c.buf = append(c.buf, '*')
	c.buf = strconv.AppendInt(c.buf, int64(len(args)), 10)
	c.buf = append(c.buf, "\r\n"...)
	for _, a := range args {
		c.buf = append(c.buf, '$')
		c.buf = strconv.AppendInt(c.buf, int64(len(a)), 10)
		c.buf = append(c.buf, "\r\n"...)
		c.buf = append(c.buf, a...)
		c.buf = append(c.buf, "\r\n"...)
	}
	w.Write(c.buf)
}

func (c *RESP) keyName(k uint64) []byte {
	c.key = strconv.AppendUint(append(c.key[:0], "key:"...), k, 10)
	return c.key
}

func (c *RESP) WriteSet(w *bufio.Writer, k uint64, value []byte) {
	c.command(w, []byte("SET"), c.keyName(k), value)
}

func (c *RESP) WriteGet(w *bufio.Writer, k uint64) { c.command(w, []byte("GET"), c.keyName(k)) }

func (c *RESP) ReadSet(r *bufio.Reader, k uint64) error {
	t, body, err := c.reply(r)
	if err != nil {
		return err
	}
	if t != '+' || string(body) != "OK" {
		return fmt.Errorf("SET key:%d: reply %c%q, want +OK", k, t, body)
	}
	return nil
}

func (c *RESP) ReadGet(r *bufio.Reader, k uint64) ([]byte, error) {
	t, body, err := c.reply(r)
	if err != nil {
		return nil, err
	}
	if t != '$' {
		return nil, fmt.Errorf("GET key:%d: reply %c%q, want a bulk string", k, t, body)
	}
	return body, nil
}

// reply reads one reply: its type byte and its payload (nil for a null bulk string; an error
// reply is an error).
func (c *RESP) reply(r *bufio.Reader) (byte, []byte, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, nil, fmt.Errorf("reading a reply: %w", err)
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return 0, nil, fmt.Errorf("malformed reply %q", line)
	}
	t, body := line[0], line[1:len(line)-2]
	switch t {
	case '-':
		return 0, nil, fmt.Errorf("redis: %s", body)
	case '+', ':':
		return t, append(c.data[:0], body...), nil
	case '$':
		n, err := strconv.Atoi(string(body))
		if err != nil {
			return 0, nil, fmt.Errorf("malformed bulk length %q", body)
		}
		if n < 0 {
			return t, nil, nil
		}
		c.data = append(c.data[:0], make([]byte, n+2)...)
		if _, err := io.ReadFull(r, c.data); err != nil {
			return 0, nil, fmt.Errorf("reading a bulk reply: %w", err)
		}
		return t, c.data[:n], nil
	}
	return 0, nil, fmt.Errorf("unexpected reply type %q", t)
}
