// Command ctrl benchmarks the ctrl's two latencies that depend on where it keeps its state:
// slab placement (a client's AllocSlab, answered once the placement is saved) and
// re-replication (a memory server killed until the ctrl lists a replacement replica for its
// slab, and the client's ReplicaReady, answered once saved), with the state in a directory
// (the file store) against etcd of one member and of three. It writes a section of
// results/fabric.md, between markers, and the raw rows beside it (results/fabric-ctrl.csv).
//
// Everything is real and on loopback: etcd's own server (scripts/test-deps.sh builds it), one
// `farmem ctrl` process per store, three `farmem memserver` processes per ctrl, and the Go
// client (ctrl.Client) the runtime uses. The stores are measured side by side in interleaved
// rounds, the order rotated each round.
package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/csv"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/fabric"
)

var (
	out      = flag.String("out", "results/fabric.md", "the report this writes its section into (created if missing)")
	rawOut   = flag.String("csv", "results/fabric-ctrl.csv", "the raw rows")
	farmem   = flag.String("farmem", "bin/farmem", "the farmem binary (make build)")
	etcdBin  = flag.String("etcd", cmp.Or(os.Getenv("FARMEM_ETCD"), "/var/cache/farmem-etcd/etcd-v3.7.3"), "etcd's server (scripts/test-deps.sh builds it)")
	rounds   = flag.Int("rounds", 5, "interleaved rounds")
	allocs   = flag.Int("allocs", 40, "placements per store per round")
	replaces = flag.Int("replaces", 2, "server kills (re-replications) per store per round")
	commit   = flag.String("commit", "", "the commit measured (the Makefile passes it)")
)

const (
	deadAfter = time.Second // the ctrl's minimum: the kill-to-replacement time is mostly this
	slabSize  = "1MiB"
	capacity  = "256MiB"
	servers   = 3
	replicas  = 2
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-ctrl:", err)
		os.Exit(1)
	}
}

// row is one timed operation.
type row struct {
	store, kind string
	round, seq  int
	us          float64
}

type stack struct {
	name    string
	dir     string
	addr    string
	ctrlArg []string // --state DIR or --etcd URLs
	ctrl    *proc
	servers []*proc
	cli     *ctrl.Client
	sess    fabric.SessionID
	nSrv    int
}

func run() error {
	if *rounds < 1 || *allocs < 1 || *replaces < 0 {
		return fmt.Errorf("-rounds and -allocs must be at least 1, -replaces at least 0")
	}
	for _, b := range []struct{ path, how string }{{*farmem, "make build"}, {*etcdBin, "scripts/test-deps.sh"}} {
		if _, err := os.Stat(b.path); err != nil {
			return fmt.Errorf("%s is missing: %s makes it", b.path, b.how)
		}
	}
	work, err := os.MkdirTemp("", "bench-ctrl-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.kill()
		}
	}()
	tokFile := filepath.Join(work, "token")
	if err := os.WriteFile(tokFile, []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		return err
	}
	tok, err := fabric.LoadToken(tokFile)
	if err != nil {
		return err
	}
	e1, err := startEtcd(work, "e1-", 1, &procs)
	if err != nil {
		return err
	}
	e3, err := startEtcd(work, "e3-", 3, &procs)
	if err != nil {
		return err
	}
	stacks := []*stack{
		{name: "file", ctrlArg: []string{"--state", filepath.Join(work, "state")}},
		{name: "etcd, 1 member", ctrlArg: []string{"--etcd", strings.Join(e1, ",")}},
		{name: "etcd, 3 members", ctrlArg: []string{"--etcd", strings.Join(e3, ",")}},
	}
	for i, s := range stacks {
		s.dir = filepath.Join(work, fmt.Sprintf("stack%d", i))
		os.MkdirAll(s.dir, 0o700)
		s.addr = "127.0.0.1:" + freePort()
		args := append([]string{"ctrl", "--listen", s.addr, "--token-file", tokFile, "--slab-size", slabSize,
			"--dead-after", deadAfter.String()}, s.ctrlArg...)
		if s.ctrl, err = startProc(filepath.Join(s.dir, "ctrl.log"), *farmem, args...); err != nil {
			return err
		}
		procs = append(procs, s.ctrl)
		s.cli = ctrl.NewClient(s.addr, tok, nil)
		for range servers {
			p, err := s.startServer(tokFile)
			if err != nil {
				return err
			}
			procs = append(procs, p)
		}
		if err := s.awaitServers(servers); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		sess, err := s.cli.OpenSession(ctx, "bench-ctrl")
		cancel()
		if err != nil {
			return fmt.Errorf("%s: opening a session: %v", s.name, err)
		}
		s.sess = sess.ID
	}
	fmt.Fprintf(os.Stderr, "bench-ctrl: %d rounds of %d placements and %d re-replications per store\n", *rounds, *allocs, *replaces)
	var rows []row
	for r := range *rounds {
		for k := range stacks {
			s := stacks[(k+r)%len(stacks)]
			got, err := s.placements(r)
			if err != nil {
				return err
			}
			rows = append(rows, got...)
			for i := range *replaces {
				got, p, err := s.rereplicate(r, i, tokFile)
				if p != nil {
					procs = append(procs, p)
				}
				if err != nil {
					return err
				}
				rows = append(rows, got...)
			}
		}
		fmt.Fprintf(os.Stderr, "bench-ctrl: round %d of %d done\n", r+1, *rounds)
	}
	if err := writeRows(*rawOut, rows); err != nil {
		return err
	}
	return writeReport(*out, *rawOut, stacks, rows)
}

func (s *stack) startServer(tokFile string) (*proc, error) {
	s.nSrv++
	p, err := startProc(filepath.Join(s.dir, fmt.Sprintf("memserver%d.log", s.nSrv)), *farmem, "memserver",
		"--listen", "127.0.0.1:"+freePort(), "--capacity", capacity, "--ctrl", s.addr, "--token-file", tokFile)
	if err == nil {
		s.servers = append(s.servers, p)
	}
	return p, err
}

// awaitServers waits until the ctrl counts n healthy servers (60 s is a hang, not a timing).
func (s *stack) awaitServers(n int) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := s.cli.Status(ctx)
		cancel()
		if err == nil && st.Totals.HealthyServers == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: the ctrl does not count %d healthy memory servers after 60s (%v); its log: %s", s.name, n, err, s.ctrl.logPath)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// placements allocates and frees -allocs slabs, timing each allocation.
func (s *stack) placements(round int) ([]row, error) {
	var rows []row
	for i := range *allocs {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		t := time.Now()
		sl, err := s.cli.AllocSlab(ctx, s.sess, replicas)
		d := time.Since(t)
		if err == nil {
			err = s.cli.FreeSlab(ctx, s.sess, sl.ID)
		}
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%s: placement: %v", s.name, err)
		}
		rows = append(rows, row{store: s.name, kind: "place", round: round, seq: i, us: us(d)})
	}
	return rows, nil
}

// rereplicate places a slab, kills (SIGKILL) one of its servers, times until the ctrl lists
// a replacement replica, then times the client's ReplicaReady; a new server then takes the
// dead one's place.
func (s *stack) rereplicate(round, seq int, tokFile string) ([]row, *proc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sl, err := s.cli.AllocSlab(ctx, s.sess, replicas)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: placement: %v", s.name, err)
	}
	had := map[string]bool{}
	for _, r := range sl.Replicas {
		had[r.Server] = true
	}
	// Which process is the first replica's server: the one whose advertised address it names.
	var victim *proc
	for _, p := range s.servers {
		if i := slices.Index(p.args, "--listen"); p.alive() && i >= 0 && p.args[i+1] == sl.Replicas[0].Addr {
			victim = p
		}
	}
	if victim == nil {
		return nil, nil, fmt.Errorf("%s: no running memory server at %s", s.name, sl.Replicas[0].Addr)
	}
	victim.kill()
	killed := time.Now()
	var repl ctrl.Replica
	for repl.Server == "" {
		_, slabs, err := s.cli.Slabs(ctx, s.sess)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: slab map: %v", s.name, err)
		}
		for _, x := range slabs {
			if x.ID != sl.ID {
				continue
			}
			for _, r := range x.Replicas {
				if !had[r.Server] && r.State == ctrl.Rebuilding {
					repl = r
				}
			}
		}
		if time.Since(killed) > 20*time.Second {
			return nil, nil, fmt.Errorf("%s: no replacement for slab %d 20s after its server was killed", s.name, sl.ID)
		}
		if repl.Server == "" {
			time.Sleep(2 * time.Millisecond)
		}
	}
	placed := time.Since(killed)
	t := time.Now()
	err = s.cli.ReplicaReady(ctx, s.sess, sl.ID, repl.Server)
	ready := time.Since(t)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: replica ready: %v", s.name, err)
	}
	if err := s.cli.FreeSlab(ctx, s.sess, sl.ID); err != nil {
		return nil, nil, fmt.Errorf("%s: free: %v", s.name, err)
	}
	p, err := s.startServer(tokFile)
	if err != nil {
		return nil, nil, err
	}
	if err := s.awaitServers(servers); err != nil {
		return nil, p, err
	}
	return []row{
		{store: s.name, kind: "replace", round: round, seq: seq, us: us(placed)},
		{store: s.name, kind: "ready", round: round, seq: seq, us: us(ready)},
	}, p, nil
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

// proc is a child process, killed if this one dies.
type proc struct {
	cmd     *exec.Cmd
	args    []string
	logPath string
	done    chan struct{}
}

func startProc(logPath, bin string, args ...string) (*proc, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("starting %s: %v", bin, err)
	}
	p := &proc{cmd: cmd, args: args, logPath: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); lf.Close(); close(p.done) }()
	return p, nil
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// startEtcd runs an n-member etcd cluster on loopback and waits until every member is healthy.
func startEtcd(work, name string, n int, procs *[]*proc) ([]string, error) {
	clients, peers := make([]string, n), make([]string, n)
	var initial []string
	for i := range n {
		clients[i] = "http://127.0.0.1:" + freePort()
		peers[i] = "http://127.0.0.1:" + freePort()
		initial = append(initial, fmt.Sprintf("%s%d=%s", name, i, peers[i]))
	}
	for i := range n {
		m := fmt.Sprintf("%s%d", name, i)
		p, err := startProc(filepath.Join(work, m+".log"), *etcdBin, "--name", m, "--data-dir", filepath.Join(work, m),
			"--listen-client-urls", clients[i], "--advertise-client-urls", clients[i],
			"--listen-peer-urls", peers[i], "--initial-advertise-peer-urls", peers[i],
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "bench-ctrl-"+name, "--log-level", "error")
		if err != nil {
			return nil, err
		}
		*procs = append(*procs, p)
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	for _, u := range clients {
		deadline := time.Now().Add(60 * time.Second)
		for {
			resp, err := hc.Get(u + "/health")
			if err == nil {
				var b bytes.Buffer
				b.ReadFrom(resp.Body)
				resp.Body.Close()
				if strings.Contains(b.String(), `"health":"true"`) {
					break
				}
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("etcd at %s not healthy after 60s (logs in %s)", u, work)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return clients, nil
}

func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	return p
}

func writeRows(path string, rows []row) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	w.Write([]string{"store", "kind", "round", "seq", "latency_us"})
	for _, r := range rows {
		w.Write([]string{r.store, r.kind, strconv.Itoa(r.round), strconv.Itoa(r.seq), strconv.FormatFloat(r.us, 'f', 1, 64)})
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

const (
	beginMark = "<!-- bench-ctrl: made by make bench-ctrl; everything to the end marker is replaced by its next run -->"
	endMark   = "<!-- /bench-ctrl -->"
)

// writeReport puts the section into the report, replacing the one a previous run wrote.
func writeReport(path, rawPath string, stacks []*stack, rows []row) error {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	host, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	w("%s\n## The ctrl's store: slab placement and re-replication latency\n\n", beginMark)
	w("Made by `make bench-ctrl`, which ran `%s`, at commit %s on %s: Linux %s, %d CPUs, %s. Raw rows (one per operation, microseconds): [%s](%s).\n\n",
		strings.Join(os.Args, " "), cmp.Or(*commit, "(not given)"), time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		strings.TrimSpace(string(host)), runtime.NumCPU(), runtime.Version(), filepath.Base(rawPath), filepath.Base(rawPath))
	w("One `farmem ctrl` per store, each with %d `farmem memserver` processes (%s, %s slabs, --dead-after %v), all on loopback, and etcd's own server (%s; one member; three members on one host, so a commit waits for a second member's fsync but for no network); the client is ctrl.Client, as `farmem run` uses it. %d rounds, the stores' order rotated each round. ",
		servers, capacity, slabSize, deadAfter, filepath.Base(*etcdBin), *rounds)
	w("*Placement*: AllocSlab at %d replicas, answered once the placement is saved (then freed, untimed). *Re-replication*: a slab placed, one of its servers killed with SIGKILL, then the slab map polled every 2 ms until the ctrl lists a replacement replica: most of it is the %v the ctrl waits for a heartbeat and where the kill fell between two heartbeats (every 500 ms), and the replacement is listed as soon as it is decided, its save running beside. *Ready*: the client's ReplicaReady for it, answered once saved.\n\n", replicas, deadAfter)
	w("| store | placement p50 ms | p90 ms | n | re-replication p50 ms | n | ready p50 ms | n |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range stacks {
		q := func(kind string, p float64) (string, int) {
			var v []float64
			for _, r := range rows {
				if r.store == s.name && r.kind == kind {
					v = append(v, r.us)
				}
			}
			if len(v) == 0 {
				return "", 0
			}
			slices.Sort(v)
			return fmt.Sprintf("%.2f", v[int(p*float64(len(v)-1)+0.5)]/1e3), len(v)
		}
		p50, n := q("place", 0.5)
		p90, _ := q("place", 0.9)
		r50, rn := q("replace", 0.5)
		d50, dn := q("ready", 0.5)
		w("| %s | %s | %s | %d | %s | %d | %s | %d |\n", s.name, p50, p90, n, r50, rn, d50, dn)
	}
	w("\n%s\n", endMark)
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	doc := string(old)
	if i := strings.Index(doc, beginMark); i >= 0 {
		if j := strings.Index(doc[i:], endMark); j >= 0 {
			rest := doc[i+j+len(endMark):]
			doc = doc[:i] + strings.TrimPrefix(rest, "\n")
		}
	}
	if doc != "" && !strings.HasSuffix(doc, "\n\n") {
		doc = strings.TrimRight(doc, "\n") + "\n\n"
	}
	return os.WriteFile(path, []byte(doc+b.String()), 0o644)
}
