// Command memcachedrive drives a memcached for farmem's benchmarks and checks every value it
// reads back, as redisdrive does for redis: the same phases, flags, key distribution and values,
// over memcached's text protocol on one connection (the standard library only):
//
//  1. populate: set --keys keys of --value-bytes bytes, pipelined in batches of --batch;
//  2. run: --ops gets and sets (--get-ratio of them gets; 0.95 is YCSB-style ETC, 0.75 SYS) on
//     keys drawn from YCSB's zipfian distribution (theta --zipf-s, ranks spread over the keys by
//     a seeded permutation), pipelined the same way;
//  3. verify: get every key once (unless --verify-all=false).
//
// Every value encodes its key and a per-key version, and the driver keeps each key's version: a
// get must return exactly the value last written (replies on one connection come in order). A
// missing key is a failure too, so memcached must be started with room for every item (-m above
// keys x (value-bytes + ~100)), or it would evict and the check would report it.
// Output: "memcachedrive: PHASE ... secs=S ops_per_sec=R" per phase, "memcachedrive: run_latency
// batch=B p50_us=X p99_us=Y max_us=Z" (each run-phase request, from the flush that sent its batch
// to its reply), then "memcachedrive: OK ..." (exit 0), or "memcachedrive: BAD ..." (exit 1);
// bad flags exit 2.
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

var errBad = errors.New("bad data")

type op struct {
	get  bool
	key  uint64
	want uint32
}

type driver struct {
	w        *bufio.Writer
	r        *bufio.Reader
	size     int
	versions []uint32 // the version last written to each key (0: never)
	ops      []op
	val, exp []byte
	lat      []time.Duration // when not nil, each reply's latency is appended (the run phase)
}

func (d *driver) set(k uint64) {
	d.versions[k]++
	d.val = ycsb.Value(d.val[:0:d.size], k, d.versions[k])
	fmt.Fprintf(d.w, "set key:%d 0 0 %d\r\n", k, len(d.val))
	d.w.Write(d.val)
	d.w.WriteString("\r\n")
	d.ops = append(d.ops, op{key: k})
}

func (d *driver) get(k uint64) {
	fmt.Fprintf(d.w, "get key:%d\r\n", k)
	d.ops = append(d.ops, op{get: true, key: k, want: d.versions[k]})
}

func (d *driver) line() ([]byte, error) {
	l, err := d.r.ReadSlice('\n')
	if err != nil {
		return nil, fmt.Errorf("reading a reply: %w", err)
	}
	if len(l) < 2 || l[len(l)-2] != '\r' {
		return nil, fmt.Errorf("malformed reply line %q", l)
	}
	return l[:len(l)-2], nil
}

func (d *driver) flushAt(batch int) error {
	if len(d.ops) < batch {
		return nil
	}
	return d.flush()
}

// flush sends the batch and checks every reply.
func (d *driver) flush() error {
	sent := time.Now()
	if err := d.w.Flush(); err != nil {
		return fmt.Errorf("sending: %w", err)
	}
	for _, o := range d.ops {
		l, err := d.line()
		if err != nil {
			return err
		}
		if !o.get {
			if string(l) != "STORED" {
				return fmt.Errorf("set key:%d: reply %q, want STORED", o.key, l)
			}
		} else {
			if string(l) == "END" {
				return fmt.Errorf("%w: get key:%d: no such key, want version %d", errBad, o.key, o.want)
			}
			// VALUE <key> <flags> <bytes>
			f := bytes.Fields(l)
			if len(f) != 4 || string(f[0]) != "VALUE" || string(f[1]) != "key:"+strconv.FormatUint(o.key, 10) {
				return fmt.Errorf("get key:%d: reply %q", o.key, l)
			}
			n, err := strconv.Atoi(string(f[3]))
			if err != nil || n < 0 {
				return fmt.Errorf("get key:%d: bad length in %q", o.key, l)
			}
			data := make([]byte, n+2)
			if _, err := io.ReadFull(d.r, data); err != nil {
				return fmt.Errorf("reading a value: %w", err)
			}
			if end, err := d.line(); err != nil || string(end) != "END" {
				return fmt.Errorf("get key:%d: no END after the value (%q, %v)", o.key, end, err)
			}
			d.exp = ycsb.Value(d.exp[:0:d.size], o.key, o.want)
			if body := data[:n]; !bytes.Equal(body, d.exp) {
				return fmt.Errorf("%w: get key:%d: got %d bytes %q..., want %d bytes %q...", errBad, o.key, len(body), body[:min(len(body), 32)], len(d.exp), d.exp[:min(len(d.exp), 32)])
			}
		}
		if d.lat != nil {
			d.lat = append(d.lat, time.Since(sent))
		}
	}
	d.ops = d.ops[:0]
	return nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:11211", "memcached's address")
	keys := flag.Uint64("keys", 100000, "keys to populate, and the key space of the run")
	valueBytes := flag.Int("value-bytes", 1000, "bytes in each value (at least 32)")
	ops := flag.Uint64("ops", 100000, "get/set operations after the populate")
	getRatio := flag.Float64("get-ratio", 0.9, "fraction of the operations that are gets (the rest sets)")
	zipfS := flag.Float64("zipf-s", 0.99, "the zipfian constant (YCSB's theta, in (0, 1))")
	batch := flag.Int("batch", 64, "commands per pipelined batch")
	seed := flag.Int64("seed", 1, "seed for the key draws and the operation mix")
	verifyAll := flag.Bool("verify-all", true, "get every key at the end and check it")
	wait := flag.Duration("wait", 10*time.Second, "how long to keep trying to connect")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: memcachedrive [flags]\n  populate --keys, run --ops zipfian get/set on them, check every value read\n")
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
			fmt.Printf("memcachedrive: BAD %v\n", err)
		} else {
			fmt.Printf("memcachedrive: BAD (error) %v\n", err)
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
		w:        bufio.NewWriterSize(nc, 64<<10),
		r:        bufio.NewReaderSize(nc, 64<<10),
		size:     size,
		versions: make([]uint32, keys),
		val:      make([]byte, 0, size),
		exp:      make([]byte, 0, size),
	}
	phase := func(each func(i uint64), n uint64) (float64, error) {
		t0 := time.Now()
		for i := uint64(0); i < n; i++ {
			each(i)
			if err := d.flushAt(batch); err != nil {
				return 0, err
			}
		}
		if err := d.flush(); err != nil {
			return 0, err
		}
		return time.Since(t0).Seconds(), nil
	}

	secs, err := phase(d.set, keys)
	if err != nil {
		return err
	}
	fmt.Printf("memcachedrive: populate keys=%d value_bytes=%d secs=%.3f ops_per_sec=%.0f\n", keys, size, secs, float64(keys)/secs)

	r := rand.New(rand.NewSource(seed))
	z := ycsb.NewZipfian(keys, theta)
	perm := r.Perm(int(keys)) // popularity rank -> key
	var gets, sets uint64
	d.lat = make([]time.Duration, 0, ops)
	secs, err = phase(func(uint64) {
		k := uint64(perm[z.Next(r)])
		if r.Float64() < getRatio {
			d.get(k)
			gets++
		} else {
			d.set(k)
			sets++
		}
	}, ops)
	if err != nil {
		return err
	}
	runRate := float64(ops) / secs
	fmt.Printf("memcachedrive: run ops=%d gets=%d sets=%d zipf=%.2f secs=%.3f ops_per_sec=%.0f\n", ops, gets, sets, theta, secs, runRate)
	if len(d.lat) > 0 {
		slices.Sort(d.lat)
		q := func(f float64) float64 { return float64(d.lat[int(f*float64(len(d.lat)-1))].Nanoseconds()) / 1e3 }
		fmt.Printf("memcachedrive: run_latency batch=%d p50_us=%.1f p99_us=%.1f max_us=%.1f\n", batch, q(0.5), q(0.99), q(1))
	}
	d.lat = nil

	if verifyAll {
		if secs, err = phase(d.get, keys); err != nil {
			return err
		}
		fmt.Printf("memcachedrive: verify keys=%d secs=%.3f ops_per_sec=%.0f\n", keys, secs, float64(keys)/secs)
	}
	fmt.Printf("memcachedrive: OK keys=%d ops=%d ops_per_sec=%.0f\n", keys, ops, runRate)
	return nil
}
