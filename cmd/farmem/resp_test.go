package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var ioReadFull = io.ReadFull
var mustCompile = regexp.MustCompile

// redisConn is a minimal RESP client: enough for the tests' commands.
type redisConn struct {
	c  net.Conn
	rd *bufio.Reader
}

func dialRedis(t *testing.T, port int) *redisConn {
	c := dialRetry(t, port)
	t.Cleanup(func() { c.Close() })
	return &redisConn{c: c, rd: bufio.NewReaderSize(c, 1<<20)}
}

func (r *redisConn) send(args ...string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	_, err := io.WriteString(r.c, b.String())
	return err
}

// reply reads one reply, flattening arrays into their elements joined by newlines.
func (r *redisConn) reply() (string, error) {
	line, err := r.rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r.rd, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, _ := strconv.Atoi(line[1:])
		parts := make([]string, 0, n)
		for i := 0; i < n; i++ {
			s, err := r.reply()
			if err != nil {
				return "", err
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("redis: unexpected reply %q", line)
}

func (r *redisConn) must(t *testing.T, args ...string) string {
	t.Helper()
	if err := r.send(args...); err != nil {
		t.Fatal(err)
	}
	s, err := r.reply()
	if err != nil {
		t.Fatalf("%s: %v", args[0], err)
	}
	return s
}
