// Command farmem runs an unmodified program with a cap on its local memory; the rest of its
// anonymous memory lives in a backend and comes back on demand.
package main

import (
	"bufio"
	"cmp"
	"crypto/x509"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/launcher"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/remote"
	"github.com/farmem/farmem/uffd"
)

// minLocalMem is the smallest cap: below it the eviction headroom and the program's own
// non-heap memory leave nothing to page.
const minLocalMem = 16 << 20

// maxEvictHeat bounds --evict-heat: a page in use already stays 16 rounds of the queue at that.
const maxEvictHeat = 15

// farmem's own exit statuses, as env, timeout and docker run use them. Any other status of
// farmem run is the program's: its exit status, or 128+N if it was killed by signal N.
const (
	exitFailed    = 125 // farmem failed: bad input, no userfaultfd, backend unreachable, an internal error
	exitCannotRun = 126 // the program was found but cannot be executed
	exitNotFound  = 127 // the program was not found
)

// exitCodesHelp is the table of exit statuses in farmem run's help.
const exitCodesHelp = "Exit status, as env, timeout and docker run give theirs:\n" +
	"   125        farmem failed: bad flags, an unparsable or too small --local-mem, no userfaultfd\n" +
	"              permission, the ctrl or memory servers unreachable at start, an internal error\n" +
	"   126        the program cannot be executed: no execute permission, a directory, not x86-64,\n" +
	"              neither ELF nor #! script, its interpreter or dynamic loader missing\n" +
	"   127        the program was not found\n" +
	"   128+N      the program was killed by signal N\n" +
	"   any other  the program's own exit status, unchanged (a program exiting 2 makes farmem exit 2)\n" +
	"farmem's flags are checked before the program: with both wrong, the status is 125. A program\n" +
	"farmem stops because a page could not be served exits as that kill leaves it (SIGKILL: 137),\n" +
	"with a message; if it had already exited 0 (a fork child was stopped), farmem exits 125. A\n" +
	"failure after the run (writing --record-faults) leaves the program's status, or 125 for 0."

// usageError is bad input: one line on stderr, exit status 125, nothing started.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }
func (usageError) ExitCode() int   { return exitFailed }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// programError is a program farmem run cannot start: exit status 126 or 127, nothing started.
type programError struct {
	msg  string
	code int
}

func (e programError) Error() string { return e.msg }
func (e programError) ExitCode() int { return e.code }

func main() {
	code, msg := exitStatus(newApp().Run(os.Args))
	if msg != "" {
		fmt.Fprintf(os.Stderr, "farmem: %s\n", msg)
	}
	os.Exit(code)
}

// exitStatus is farmem's exit status and the line to print for what a command returned. An
// error that carries no status is a command's plain failure: 1 (farmem run gives its own 125).
func exitStatus(err error) (int, string) {
	var ex cli.ExitCoder
	switch {
	case err == nil:
		return 0, ""
	case errors.As(err, &ex):
		return ex.ExitCode(), err.Error()
	default:
		return 1, err.Error()
	}
}

func newApp() *cli.App {
	app := &cli.App{
		Name:    "farmem",
		Usage:   "run a program with a cap on its local memory; the rest lives in far memory",
		Version: version(),
		Description: "Example:\n   farmem run --local-mem 256MiB -- redis-server --port 6400 --save ''\n\n" +
			"The program runs unmodified through a preload shim; its anonymous memory beyond the cap\n" +
			"is evicted to the backend (embedded in farmem unless memory servers are given) and brought\n" +
			"back 4 KiB at a time when touched.\n\n" +
			"Bad input to any command (an unknown flag, a bad value) exits 125, as docker's commands do;\n" +
			"farmem run's exit statuses are in farmem help run.",
		// main prints the error and exits with its status: urfave/cli would exit from inside Run.
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return usageError{err.Error()}
		},
		// urfave/cli adds --help itself only when it adds its own help command.
		Flags: []cli.Flag{cli.HelpFlag},
		// Reached only when no command matched: farmem alone, or farmem NOTACOMMAND.
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("no command %q: farmem help lists them", c.Args().First())
			}
			return cli.ShowAppHelp(c)
		},
		Commands: []*cli.Command{runCommand(), attachCommand(), memserverCommand(), ctrlCommand(), statusCommand(), certCommand(), simCommand(),
			doctorCommand(), versionCommand(), helpCommand()},
	}
	// No command has subcommands, so none needs urfave/cli's help subcommand; with it,
	// `farmem run --local-mem 1g -- help` would show help instead of running a program named help.
	for _, c := range app.Commands {
		c.HideHelpCommand = true
	}
	return app
}

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "run a program under a local-memory cap",
		ArgsUsage: "-- PROGRAM [ARGS...]",
		Description: "SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1/2 are forwarded to the program. If farmem cannot\n" +
			"serve a page (it crashed, the backend lost it), the program is stopped: it never reads zeros\n" +
			"in its place.\n\n" +
			"Where it can (root; cgroup v1, or v2 with farmem alone in its cgroup or in the root), farmem\n" +
			"starts the program in a memory cgroup of its own (farmem-PID, inside farmem's cgroup, removed\n" +
			"at exit; on v2 farmem moves itself into farmem-PID.self beside it meanwhile). It sets no\n" +
			"limit there: its usage thresholds (on v2 memory.high, lifted as soon as it is crossed) only\n" +
			"tell farmem when the program nears the cap, so that farmem need not poll. farmem doctor says\n" +
			"what it does here.\n\n" +
			exitCodesHelp + "\n\n" + otelEnvHelp,
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "local-mem", Usage: "cap on the program's resident anonymous memory, at least 16MiB; required. SIZE: 512m or\n\t512MiB (k, m, g, t and KiB, MiB... are 1024-based, as docker and systemd read them), 800MB (KB,\n\tMB... are 1000-based), a byte count, or 25% (of the machine's memory: MemTotal). kb, mb... are\n\trefused as ambiguous (docker reads 512mb as 512MiB, SI as 512MB)"},
			&cli.StringFlag{Name: "compress", Value: "none", Usage: "how the embedded backend keeps evicted pages: none, lz4 or zstd. Compression makes the cap save\n\tthe machine's memory too, at a cost: at a 25% cap redis ran 0.91-1.04x as fast with lz4 and\n\t0.74-0.76x with zstd as with none (results/redis.md, measured before the pinning: stale)"},
			&cli.StringFlag{Name: "ctrl", Usage: "HOST:PORT of a farmem ctrl, or a comma-separated list of the ctrls: keep evicted pages\n\ton its memory servers instead of in this process (needs --token-file)"},
			&cli.StringFlag{Name: "transport", Value: "tcp", Usage: "with --ctrl: how to reach memory servers: tcp; shm (a memory server on this host started\n\twith --shm DIR is reached through shared memory: no request per page; others by tcp); rdma"},
			&cli.StringFlag{Name: "shm", Value: defaultSHMDir, Usage: "with --transport shm: the DIR given to the memory servers' --shm"},
			spinFlag("with --ctrl, over tcp: poll for each answer up to DURATION before sleeping", defaultRunSpin),
			&cli.IntFlag{Name: "replicas", Value: 1, Usage: "with --ctrl: copies of every evicted page, each on a different memory server. With 2 or\n\tmore, losing a server loses nothing; with 1, losing it stops the program (never zeros)"},
			ctrlTokenFlag("with --ctrl"),
			caFlag(),
			&cli.IntFlag{Name: "evict-heat", Value: pagetable.DefaultMaxHeat, Usage: "how many extra rounds of the eviction queue a page may earn by coming back soon after each\n\teviction (0 to 15; 0: plain first-in first-out). farmem sees no access bits, only faults: a page\n\tfaulted back within a round of its eviction was in use, and is passed over once more for each\n\tsuch return in a row"},
			writeGuessFlag(),
			&cli.StringFlag{Name: "serve-faults", Value: "farmem", Usage: "where the faults on evicted pages are served: farmem (its fault thread, in its own process),\n\tor program (experimental: a thread farmem starts in each process serves the re-faults that\n\tfollow no trend from the embedded store, with no switch to farmem and back, and sends farmem\n\tthe rest; uncompressed embedded store only; a fork child has been seen to hang at its own fork)"},
			&cli.BoolFlag{Name: "quiet", Usage: "no summary on stderr at exit"},
			&cli.StringFlag{Name: "summary-json", TakesFile: true, Usage: "at exit, write the whole summary to FILE as one JSON object, in raw numbers (bytes, pages,\n\tnanoseconds, histograms' buckets; its fields are in the README), --quiet or not"},
			// Hidden: enter a dynamic program by injection, as a static one is, instead of preloading
			// the shim. It exists to measure whether the preload path is worth keeping beside
			// injection (workloads/reach compares the two); not a user's choice, so not in the help.
			&cli.BoolFlag{Name: "inject", Hidden: true},
		}, append(prefetchFlags(), telemetryFlags()...)...),
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageError{err.Error()} },
		Action: func(c *cli.Context) error {
			err := runAction(c)
			var ex cli.ExitCoder
			if err != nil && !errors.As(err, &ex) {
				return cli.Exit(err.Error(), exitFailed) // farmem's own failure, not the program's
			}
			return err
		},
	}
}

// localMem is the cap --local-mem gives, for run and attach alike (the usage error, 125, if it
// is missing, unreadable or below the minimum); what names what is capped in the error.
func localMem(c *cli.Context, what string) (int64, error) {
	if !c.IsSet("local-mem") {
		return 0, usagef("--local-mem SIZE is required: how much local memory the %s may use", what)
	}
	capBytes, err := parseMemSize(c.String("local-mem"))
	if err != nil {
		return 0, usagef("--local-mem: %v", err)
	}
	if capBytes < minLocalMem {
		return 0, usagef("--local-mem %s (%s) is below the minimum of 16MiB", c.String("local-mem"), formatSize(capBytes))
	}
	return capBytes, nil
}

// writeGuessFlag is --write-guess, for run and attach.
func writeGuessFlag() cli.Flag {
	return &cli.StringFlag{Name: "write-guess", Value: "auto", Usage: "how a page read back on a read is installed: auto (writable if its last stay wrote it, or\n\twhile most pages of the process read back are written: saves the write-protect fault), or last\n\t(writable only if its last stay wrote it: a page only read is later dropped without a copy)"}
}

// pagingOptions reads the flags run and attach share on how pages are prefetched, evicted,
// installed and kept (usage errors, 125): the Options they set, and the embedded store's codec
// (nil: none).
func pagingOptions(c *cli.Context, capBytes int64) (launcher.Options, backend.Codec, error) {
	pcfg, err := prefetchOptions(c)
	if err != nil {
		return launcher.Options{}, nil, err
	}
	cachePages, err := prefetchCachePages(c, capBytes)
	if err != nil {
		return launcher.Options{}, nil, err
	}
	heat := c.Int("evict-heat")
	if heat < 0 || heat > maxEvictHeat {
		return launcher.Options{}, nil, usagef("--evict-heat %d: give 0 to %d", heat, maxEvictHeat)
	}
	guess := c.String("write-guess")
	if guess != "auto" && guess != "last" {
		return launcher.Options{}, nil, usagef("--write-guess %q: give auto or last", guess)
	}
	codec, err := backend.CodecByName(c.String("compress"))
	if err != nil {
		return launcher.Options{}, nil, usagef("--compress: %v", err)
	}
	return launcher.Options{Prefetch: pcfg, PrefetchCachePages: cachePages, EvictHeat: uint8(heat), LastStayGuess: guess == "last"}, codec, nil
}

// embeddedStore is farmem's own store of evicted pages: raw, or compressed with codec.
func embeddedStore(codec backend.Codec) backend.Backend {
	if codec != nil {
		return backend.NewCompressed(codec)
	}
	return backend.NewMemory()
}

// runAction is farmem run. It checks farmem's flags first (125), then the program (126, 127),
// then what farmem needs from the machine and the cluster (125).
func runAction(c *cli.Context) error {
	capBytes, err := localMem(c, "program")
	if err != nil {
		return err
	}
	argv := c.Args().Slice()
	if len(argv) == 0 {
		return usagef("no program given: usage is farmem run --local-mem SIZE -- PROGRAM [ARGS...]")
	}
	paging, codec, err := pagingOptions(c, capBytes)
	if err != nil {
		return err
	}
	switch c.String("serve-faults") {
	case "farmem":
	case "program":
		paging.FaultsInProgram = true
	default:
		return usagef("--serve-faults %q: give farmem or program", c.String("serve-faults"))
	}
	if err := checkRemoteFlags(c); err != nil {
		return err
	}
	tcfg, statsEvery, err := telemetryOptions(c, argv[0])
	if err != nil {
		return err
	}
	path, static, err := checkProgram(argv[0])
	if err != nil {
		return err
	}
	if err := checkUserfaultfd(); err != nil {
		return err
	}
	argv[0] = path
	inject := static || c.Bool("inject")
	store := embeddedStore(codec)
	if c.IsSet("ctrl") {
		if store, err = openRemote(c, argv); err != nil {
			return err
		}
	}
	defer store.Close()
	// Written at exit; a path that cannot be written is bad input now, not a message after the run.
	latencyOut, summaryJSON := c.String("latency-out"), c.String("summary-json")
	for flag, path := range map[string]string{"latency-out": latencyOut, "summary-json": summaryJSON} {
		if path == "" {
			continue
		}
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			return usagef("--%s: %v", flag, err)
		}
	}
	tel, err := startTelemetry(tcfg)
	if err != nil {
		return err
	}
	trace, err := openTrace(c) // last: a failure above leaves no file behind
	if err != nil {
		stopTelemetry(tel, true)
		return err
	}
	tracing, evictTrace := tel.Tracing(store)
	o := paging
	o.LocalMem, o.Argv, o.Backend, o.Quiet = capBytes, argv, store, c.Bool("quiet")
	o.Trace, o.Tracing, o.EvictTrace, o.Observe, o.StatsEvery = trace, tracing, evictTrace, tel.Observe, statsEvery
	o.LatencyOut, o.SummaryJSON, o.Static, o.NoPreload = latencyOut, summaryJSON, inject, inject && !static
	status, err := launcher.Run(o)
	stopTelemetry(tel, c.Bool("quiet")) // after Run: the final metrics are the summary's counts
	if trace != nil {                   // Run has stopped every fault thread
		if cerr := closeTrace(c, trace); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return cli.Exit(err.Error(), failedRunStatus(status, err))
	}
	if status != 0 {
		return cli.Exit("", status)
	}
	return nil
}

// failedRunStatus is farmem's exit status when the run failed with err after launcher.Run:
// 127 or 126 if the program could not be started (os.StartProcess's error), else the program's
// status if it has one (a program farmem stopped: the kill's), else 125.
func failedRunStatus(status int, err error) int {
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Op == "fork/exec" {
		if errors.Is(pe.Err, fs.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}
	if status != 0 {
		return status
	}
	return exitFailed
}

// checkRemoteFlags checks the flags that go with --ctrl, and that none is given without it.
func checkRemoteFlags(c *cli.Context) error {
	if !c.IsSet("ctrl") {
		if c.IsSet("replicas") || c.IsSet("token-file") || c.IsSet("ca") || c.IsSet("transport") || c.IsSet("shm") || c.IsSet("spin") {
			if _, err := transportDial(c, nil); err != nil {
				return err
			}
			return usagef("--replicas, --token-file, --ca, --transport, --shm and --spin apply to memory servers: give --ctrl HOST:PORT too")
		}
		return nil
	}
	if c.String("token-file") == "" {
		return usagef("--token-file is required with --ctrl: the file holding the cluster's shared secret")
	}
	if c.IsSet("compress") {
		return usagef("--compress applies to the embedded store; memory servers keep pages as they are")
	}
	if c.String("ca") == "" {
		if err := ctrl.CheckPlaintext(c.String("ctrl")); err != nil {
			return usageError{err.Error()}
		}
	}
	if r := c.Int("replicas"); r < 1 || r > ctrl.MaxReplicas {
		return usagef("--replicas %d: give 1 to %d", r, ctrl.MaxReplicas)
	}
	_, err := transportDial(c, nil)
	return err
}

// openRemote starts a session with the ctrl; a cluster that cannot take pages fails here,
// before the program starts.
func openRemote(c *cli.Context, argv []string) (backend.Backend, error) {
	logf := func(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }
	info := logf
	if c.Bool("quiet") {
		info = func(string, ...any) {}
	}
	dial, err := transportDial(c, info) // checked by checkRemoteFlags
	if err != nil {
		return nil, err
	}
	tok, err := ctrlLoadToken(c)
	if err != nil {
		return nil, err
	}
	var ca *x509.CertPool
	if c.String("ca") != "" {
		if ca, err = ctrl.LoadCA(c.String("ca")); err != nil {
			return nil, err
		}
	}
	host, _ := os.Hostname()
	return remote.Open(remote.Config{Ctrl: c.String("ctrl"), Token: tok, CA: ca, Replicas: c.Int("replicas"), Dial: dial,
		Name: fmt.Sprintf("%s pid %d %s", host, os.Getpid(), filepath.Base(argv[0])), Logf: logf})
}

// checkProgram resolves the program and refuses what farmem cannot enter: 127 if it is not
// found, 126 if it is but cannot be run under farmem. static: the program (or the interpreter
// its #! line names) is statically linked, so farmem injects its agent instead of preloading.
func checkProgram(name string) (path string, static bool, err error) {
	path, err = exec.LookPath(name)
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			if p := notExecutableOnPath(name); p != "" {
				// As a shell says: found, but it cannot be executed (126), not "not found".
				return "", false, cannotRun("program %q cannot be run: %s is not executable", name, p)
			}
			return "", false, programError{fmt.Sprintf("program %q not found", name), exitNotFound}
		}
		return "", false, cannotRun("program %q cannot be run: %v", name, errors.Unwrap(err))
	}
	static, err = checkELF(path, 0)
	return path, static, err
}

// notExecutableOnPath returns the first regular file named name in $PATH, for a name with no
// slash that exec.LookPath found no executable of ("" if there is none).
func notExecutableOnPath(name string) string {
	if strings.Contains(name, "/") {
		return ""
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		p := filepath.Join(cmp.Or(dir, "."), name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

func cannotRun(format string, a ...any) error {
	return programError{fmt.Sprintf(format, a...), exitCannotRun}
}

// checkELF follows #! interpreters and requires an ELF at the end, whose own interpreter (the
// dynamic loader) exists if it has one; static: it has none.
func checkELF(path string, depth int) (static bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		if depth > 0 {
			return false, cannotRun("interpreter %q cannot be read: %v", path, errors.Unwrap(err))
		}
		return false, cannotRun("program %q cannot be read: %v", path, errors.Unwrap(err))
	}
	defer f.Close()
	head := make([]byte, 256)
	n, _ := f.Read(head)
	head = head[:n]
	if strings.HasPrefix(string(head), "#!") && depth < 4 {
		line, _, _ := bufio.NewReader(strings.NewReader(string(head[2:]))).ReadLine()
		fields := strings.Fields(string(line))
		if len(fields) == 0 {
			return false, cannotRun("script %q has an empty #! line", path)
		}
		return checkELF(fields[0], depth+1)
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return false, cannotRun("program %q is neither an ELF executable nor a #! script", path)
	}
	if ef.Machine != elf.EM_X86_64 {
		return false, cannotRun("program %q is for %v, not x86-64", path, ef.Machine)
	}
	for _, p := range ef.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			return false, cannotRun("program %q: its ELF interpreter cannot be read: %v", path, err)
		}
		interp := strings.TrimRight(string(b), "\x00")
		if _, err := os.Stat(interp); err != nil {
			return false, cannotRun("program %q needs the dynamic loader %s, which is missing", path, interp)
		}
		return false, nil
	}
	return true, nil
}

func checkUserfaultfd() error {
	fd, err := uffd.Open(unix.O_CLOEXEC)
	if err != nil {
		return usagef("cannot use userfaultfd (%v): run as root, or give your user read-write access to /dev/userfaultfd, or set sysctl vm.unprivileged_userfaultfd=1", err)
	}
	unix.Close(fd)
	return nil
}

// writeResult prints a command's result on its output: v as indented JSON with --json, else
// the table printTable writes.
func writeResult(c *cli.Context, v any, printTable func(io.Writer)) error {
	w := c.App.Writer
	if w == nil {
		w = os.Stdout
	}
	if c.Bool("json") {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	printTable(w)
	return nil
}
