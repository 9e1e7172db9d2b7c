package ycsb

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"net"
	"os"
	"slices"
	"time"
)

// ErrBad marks a wrong value read back, as against an error of the connection or protocol.
var ErrBad = errors.New("bad data")

// Protocol is one server's wire format for the driver: it writes set and get requests, and
// reads their replies in order. The driver pipelines, keeps the versions and checks the values.
type Protocol interface {
	WriteSet(w *bufio.Writer, key uint64, value []byte)
	WriteGet(w *bufio.Writer, key uint64)
	// ReadSet reads a set's reply and fails unless the server stored the value.
	ReadSet(r *bufio.Reader, key uint64) error
	// ReadGet reads a get's reply: the value, or nil if the server has no such key. The slice
	// may be reused by the next read.
	ReadGet(r *bufio.Reader, key uint64) ([]byte, error)
}

// Config is a driver's command line: the same flags for every server.
type Config struct {
	Name       string // the command's name, which starts every output line
	Addr       string
	Keys       uint64
	ValueBytes int
	Ops        uint64
	GetRatio   float64
	Theta      float64
	Batch      int
	Seed       int64
	VerifyAll  bool
	Wait       time.Duration
}

// Main is a driver command's main: it parses the flags (defaultAddr is the server's usual
// address; get and set name its verbs in the help), runs, and exits 0 (OK), 1 (BAD: a wrong
// value or any error) or 2 (bad flags).
func Main(name, server, defaultAddr, get, set string, p Protocol) {
	c := Config{Name: name}
	flag.StringVar(&c.Addr, "addr", defaultAddr, server+"'s address")
	flag.Uint64Var(&c.Keys, "keys", 100000, "keys to populate, and the key space of the run")
	flag.IntVar(&c.ValueBytes, "value-bytes", 1000, "bytes in each value (at least 32)")
	flag.Uint64Var(&c.Ops, "ops", 100000, get+"/"+set+" operations after the populate")
	flag.Float64Var(&c.GetRatio, "get-ratio", 0.9, "fraction of the operations that are "+get+"s (the rest "+set+"s)")
	flag.Float64Var(&c.Theta, "zipf-s", 0.99, "the zipfian constant (YCSB's theta, in (0, 1))")
	flag.IntVar(&c.Batch, "batch", 64, "commands per pipelined batch")
	flag.Int64Var(&c.Seed, "seed", 1, "seed for the key draws and the operation mix")
	flag.BoolVar(&c.VerifyAll, "verify-all", true, get+" every key at the end and check it")
	flag.DurationVar(&c.Wait, "wait", 10*time.Second, "how long to keep trying to connect")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: %s [flags]\n  populate --keys, run --ops zipfian %s/%s on them, check every value read\n", name, get, set)
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 || c.Keys < 2 || c.ValueBytes < 32 || c.Batch < 1 || c.GetRatio < 0 || c.GetRatio > 1 ||
		!(c.Theta > 0 && c.Theta < 1) {
		flag.Usage()
		os.Exit(2)
	}
	if err := Run(c, p); err != nil {
		if errors.Is(err, ErrBad) {
			fmt.Printf("%s: BAD %v\n", name, err)
		} else {
			fmt.Printf("%s: BAD (error) %v\n", name, err)
		}
		os.Exit(1)
	}
}

// op is one pipelined request: a get expecting version want of key, or a set.
type op struct {
	get  bool
	key  uint64
	want uint32
}

type driver struct {
	p        Protocol
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
	d.val = Value(d.val[:0:d.size], k, d.versions[k])
	d.p.WriteSet(d.w, k, d.val)
	d.ops = append(d.ops, op{key: k})
}

func (d *driver) get(k uint64) {
	d.p.WriteGet(d.w, k)
	d.ops = append(d.ops, op{get: true, key: k, want: d.versions[k]})
}

// flushAt flushes once batch requests are queued.
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
		if !o.get {
			if err := d.p.ReadSet(d.r, o.key); err != nil {
				return err
			}
		} else {
			body, err := d.p.ReadGet(d.r, o.key)
			if err != nil {
				return err
			}
			if body == nil {
				return fmt.Errorf("%w: get key:%d: no such key, want version %d", ErrBad, o.key, o.want)
			}
			d.exp = Value(d.exp[:0:d.size], o.key, o.want)
			if !bytes.Equal(body, d.exp) {
				return fmt.Errorf("%w: get key:%d: got %d bytes %q..., want %d bytes %q...", ErrBad, o.key, len(body), body[:min(len(body), 32)], len(d.exp), d.exp[:min(len(d.exp), 32)])
			}
		}
		if d.lat != nil {
			d.lat = append(d.lat, time.Since(sent))
		}
	}
	d.ops = d.ops[:0]
	return nil
}

// Run drives one server through the three phases over one connection, printing a line per
// phase: populate (set every key), run (Ops zipfian gets and sets, then their latencies) and
// verify (get every key, unless !VerifyAll), then OK.
func Run(c Config, p Protocol) error {
	var nc net.Conn
	var err error
	for deadline := time.Now().Add(c.Wait); ; time.Sleep(50 * time.Millisecond) {
		if nc, err = net.DialTimeout("tcp", c.Addr, time.Second); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return err
	}
	defer nc.Close()
	d := &driver{
		p:        p,
		w:        bufio.NewWriterSize(nc, 64<<10),
		r:        bufio.NewReaderSize(nc, 64<<10),
		size:     c.ValueBytes,
		versions: make([]uint32, c.Keys),
		val:      make([]byte, 0, c.ValueBytes),
		exp:      make([]byte, 0, c.ValueBytes),
	}
	phase := func(each func(i uint64), n uint64) (float64, error) {
		t0 := time.Now()
		for i := uint64(0); i < n; i++ {
			each(i)
			if err := d.flushAt(c.Batch); err != nil {
				return 0, err
			}
		}
		if err := d.flush(); err != nil {
			return 0, err
		}
		return time.Since(t0).Seconds(), nil
	}

	secs, err := phase(d.set, c.Keys)
	if err != nil {
		return err
	}
	fmt.Printf("%s: populate keys=%d value_bytes=%d secs=%.3f ops_per_sec=%.0f\n", c.Name, c.Keys, c.ValueBytes, secs, float64(c.Keys)/secs)

	r := rand.New(rand.NewSource(c.Seed))
	z := NewZipfian(c.Keys, c.Theta)
	perm := r.Perm(int(c.Keys)) // popularity rank -> key
	var gets, sets uint64
	d.lat = make([]time.Duration, 0, c.Ops)
	secs, err = phase(func(uint64) {
		k := uint64(perm[z.Next(r)])
		if r.Float64() < c.GetRatio {
			d.get(k)
			gets++
		} else {
			d.set(k)
			sets++
		}
	}, c.Ops)
	if err != nil {
		return err
	}
	runRate := float64(c.Ops) / secs
	fmt.Printf("%s: run ops=%d gets=%d sets=%d zipf=%.2f secs=%.3f ops_per_sec=%.0f\n", c.Name, c.Ops, gets, sets, c.Theta, secs, runRate)
	if len(d.lat) > 0 {
		slices.Sort(d.lat)
		q := func(f float64) float64 { return float64(d.lat[int(f*float64(len(d.lat)-1))].Nanoseconds()) / 1e3 }
		fmt.Printf("%s: run_latency batch=%d p50_us=%.1f p99_us=%.1f max_us=%.1f\n", c.Name, c.Batch, q(0.5), q(0.99), q(1))
	}
	d.lat = nil

	if c.VerifyAll {
		if secs, err = phase(d.get, c.Keys); err != nil {
			return err
		}
		fmt.Printf("%s: verify keys=%d secs=%.3f ops_per_sec=%.0f\n", c.Name, c.Keys, secs, float64(c.Keys)/secs)
	}
	fmt.Printf("%s: OK keys=%d ops=%d ops_per_sec=%.0f\n", c.Name, c.Keys, c.Ops, runRate)
	return nil
}
