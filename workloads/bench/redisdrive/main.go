// Command redisdrive drives a redis-server for farmem's benchmarks and checks every value it
// reads back. It speaks RESP itself over one connection (the standard library only):
//
//  1. populate: SET --keys keys of --value-bytes bytes, pipelined in batches of --batch;
//  2. run: --ops GETs and SETs (--get-ratio of them GETs) on keys drawn from a zipfian
//     distribution, pipelined the same way;
//  3. verify: GET every key once (unless --verify-all=false).
//
// Every value encodes its key and a per-key version (and bytes derived from both), and the
// driver keeps each key's version: a GET must return exactly the value last written to that key
// (commands on one connection run in order, so a GET behind a SET in the same batch must see
// it). Output: one line per phase, "redisdrive: PHASE ... secs=S ops_per_sec=R", then
// "redisdrive: OK ..." (exit 0), or "redisdrive: BAD ..." on the first wrong value and any error
// (exit 1); bad flags exit 2. After the run line comes "redisdrive: run_latency batch=B
// p50_us=X p99_us=Y max_us=Z": each request's latency in the run phase, from the flush that sent
// its batch to the arrival of its reply (with pipelining a request waits for the ones ahead of
// it in its batch, as a client sharing a connection would).
//
// The key distribution is YCSB's zipfian generator (Gray et al., "Quickly generating
// billion-record synthetic databases", as in YCSB's ZipfianGenerator), with its default
// constant 0.99 (--zipf-s): math/rand's Zipf needs s > 1. As YCSB's scrambled zipfian does, the
// popularity ranks are spread over the key space (here by a seeded permutation rather than a
// hash, so every key keeps its own rank): otherwise the hot keys would be the first ones
// populated, and lie next to each other in redis's memory.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/farmem/farmem/workloads/bench/ycsb"
)

type conn struct {
	c   net.Conn
	w   *bufio.Writer
	r   *bufio.Reader
	buf []byte
}

func (c *conn) command(args ...[]byte) {
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
	c.w.Write(c.buf)
}

// reply reads one reply: its type byte and its payload (nil for a null bulk string).
func (c *conn) reply() (byte, []byte, error) {
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return 0, nil, fmt.Errorf("reading a reply: %w", err)
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return 0, nil, fmt.Errorf("malformed reply %q", line)
	}
	t, body := line[0], line[1:len(line)-2]
	switch t {
	case '+', '-', ':':
		return t, append([]byte(nil), body...), nil
	case '$':
		n, err := strconv.Atoi(string(body))
		if err != nil {
			return 0, nil, fmt.Errorf("malformed bulk length %q", body)
		}
		if n < 0 {
			return t, nil, nil
		}
		data := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, data); err != nil {
			return 0, nil, fmt.Errorf("reading a bulk reply: %w", err)
		}
		return t, data[:n], nil
	}
	return 0, nil, fmt.Errorf("unexpected reply type %q", t)
}

var errBad = errors.New("bad data")

// op is one pipelined command: a GET expecting version want of key, or a SET.
type op struct {
	get  bool
	key  uint64
	want uint32
}

type driver struct {
	c        *conn
	keys     uint64
	size     int
	versions []uint32 // the version last written to each key (0: never)
	ops      []op
	val      []byte
	exp      []byte
	keyBuf   []byte
	lat      []time.Duration // when not nil, each reply's latency is appended (the run phase)
}

func (d *driver) key(k uint64) []byte {
	d.keyBuf = strconv.AppendUint(append(d.keyBuf[:0], "key:"...), k, 10)
	return d.keyBuf
}

func (d *driver) set(k uint64) {
	d.versions[k]++
	d.c.command([]byte("SET"), d.key(k), ycsb.Value(d.val[:0:d.size], k, d.versions[k]))
	d.ops = append(d.ops, op{key: k})
}

func (d *driver) get(k uint64) {
	d.c.command([]byte("GET"), d.key(k))
	d.ops = append(d.ops, op{get: true, key: k, want: d.versions[k]})
}

// flushAt flushes once batch commands are queued.
func (d *driver) flushAt(batch int) error {
	if len(d.ops) < batch {
		return nil
	}
	return d.flush()
}

// flush sends the batch and checks every reply.
func (d *driver) flush() error {
	sent := time.Now()
	if err := d.c.w.Flush(); err != nil {
		return fmt.Errorf("sending: %w", err)
	}
	for _, o := range d.ops {
		t, body, err := d.c.reply()
		if err != nil {
			return err
		}
		if d.lat != nil {
			d.lat = append(d.lat, time.Since(sent))
		}
		switch {
		case t == '-':
			return fmt.Errorf("redis: %s", body)
		case !o.get:
			if t != '+' || string(body) != "OK" {
				return fmt.Errorf("SET key:%d: reply %c%q, want +OK", o.key, t, body)
			}
		case body == nil:
			return fmt.Errorf("%w: GET key:%d: no such key, want version %d", errBad, o.key, o.want)
		default:
			d.exp = ycsb.Value(d.exp[:0:d.size], o.key, o.want)
			if !bytes.Equal(body, d.exp) {
				head := body[:min(len(body), 32)]
				return fmt.Errorf("%w: GET key:%d: got %d bytes %q..., want %d bytes %q...", errBad, o.key, len(body), head, len(d.exp), d.exp[:min(len(d.exp), 32)])
			}
		}
	}
	d.ops = d.ops[:0]
	return nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "redis-server's address")
	keys := flag.Uint64("keys", 100000, "keys to populate, and the key space of the run")
	valueBytes := flag.Int("value-bytes", 1000, "bytes in each value (at least 32)")
	ops := flag.Uint64("ops", 100000, "GET/SET operations after the populate")
	getRatio := flag.Float64("get-ratio", 0.9, "fraction of the operations that are GETs (the rest SETs)")
	zipfS := flag.Float64("zipf-s", 0.99, "the zipfian constant (YCSB's theta, in (0, 1))")
	batch := flag.Int("batch", 64, "commands per pipelined batch")
	seed := flag.Int64("seed", 1, "seed for the key draws and the operation mix")
	verifyAll := flag.Bool("verify-all", true, "GET every key at the end and check it")
	wait := flag.Duration("wait", 10*time.Second, "how long to keep trying to connect")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: redisdrive [flags]\n  populate --keys, run --ops zipfian GET/SET on them, check every value read\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 || *keys < 2 || *valueBytes < 32 || *batch < 1 || *getRatio < 0 || *getRatio > 1 ||
		!(*zipfS > 0 && *zipfS < 1) {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*addr, *keys, *valueBytes, *ops, *getRatio, *zipfS, *batch, *seed, *verifyAll, *wait); err != nil {
		if errors.Is(err, errBad) {
			fmt.Printf("redisdrive: BAD %v\n", err)
		} else {
			fmt.Printf("redisdrive: BAD (error) %v\n", err)
		}
		os.Exit(1)
	}
}

func run(addr string, keys uint64, size int, ops uint64, getRatio, theta float64, batch int, seed int64, verifyAll bool, wait time.Duration) error {
	var nc net.Conn
	var err error
	for deadline := time.Now().Add(wait); ; time.Sleep(50 * time.Millisecond) {
		if nc, err = net.DialTimeout("tcp", addr, time.Second); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return err
	}
	defer nc.Close()
	d := &driver{
		c:        &conn{c: nc, w: bufio.NewWriterSize(nc, 64<<10), r: bufio.NewReaderSize(nc, 64<<10)},
		keys:     keys,
		size:     size,
		versions: make([]uint32, keys),
		val:      make([]byte, 0, size),
		exp:      make([]byte, 0, size),
	}

	t0 := time.Now()
	for k := uint64(0); k < keys; k++ {
		d.set(k)
		if err := d.flushAt(batch); err != nil {
			return err
		}
	}
	if err := d.flush(); err != nil {
		return err
	}
	secs := time.Since(t0).Seconds()
	fmt.Printf("redisdrive: populate keys=%d value_bytes=%d secs=%.3f ops_per_sec=%.0f\n", keys, size, secs, float64(keys)/secs)

	r := rand.New(rand.NewSource(seed))
	z := ycsb.NewZipfian(keys, theta)
	perm := r.Perm(int(keys)) // popularity rank -> key
	var gets, sets uint64
	d.lat = make([]time.Duration, 0, ops)
	t0 = time.Now()
	for i := uint64(0); i < ops; i++ {
		k := uint64(perm[z.Next(r)])
		if r.Float64() < getRatio {
			d.get(k)
			gets++
		} else {
			d.set(k)
			sets++
		}
		if err := d.flushAt(batch); err != nil {
			return err
		}
	}
	if err := d.flush(); err != nil {
		return err
	}
	secs = time.Since(t0).Seconds()
	runRate := float64(ops) / secs
	fmt.Printf("redisdrive: run ops=%d gets=%d sets=%d zipf=%.2f secs=%.3f ops_per_sec=%.0f\n", ops, gets, sets, theta, secs, runRate)
	if len(d.lat) > 0 {
		slices.Sort(d.lat)
		q := func(f float64) float64 { return float64(d.lat[int(f*float64(len(d.lat)-1))].Nanoseconds()) / 1e3 }
		fmt.Printf("redisdrive: run_latency batch=%d p50_us=%.1f p99_us=%.1f max_us=%.1f\n", batch, q(0.5), q(0.99), q(1))
	}
	d.lat = nil

	if verifyAll {
		t0 = time.Now()
		for k := uint64(0); k < keys; k++ {
			d.get(k)
			if err := d.flushAt(batch); err != nil {
				return err
			}
		}
		if err := d.flush(); err != nil {
			return err
		}
		secs = time.Since(t0).Seconds()
		fmt.Printf("redisdrive: verify keys=%d secs=%.3f ops_per_sec=%.0f\n", keys, secs, float64(keys)/secs)
	}
	fmt.Printf("redisdrive: OK keys=%d ops=%d ops_per_sec=%.0f\n", keys, ops, runRate)
	return nil
}
