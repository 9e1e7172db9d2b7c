package main

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
)

// A program of the reach table: an unmodified program nobody on the project wrote, on an input
// that makes it deterministic, with what it printed reduced to a digest that must equal the
// native run's.
type program struct {
	name  string
	title string // what it runs, for the table
	// link says how farmem enters it: "dynamic" (the shim preloaded) or "static" (injected).
	link string
	// needs: the binaries it runs, checked before anything runs (missing: the row is "not run").
	needs []string
	// prepare writes its inputs into dir, once, before any run (nil: none).
	prepare func(dir string, scale float64) error
	// argv is the command line, the input files in dir.
	argv func(dir string, scale float64) []string
	// digest, if set, picks the deterministic part of the output (its first group); else the
	// whole output is digested.
	digest *regexp.Regexp
	// server, if set, makes this a server: argv starts it and server drives it.
	server *server
	// attach: started natively and capped while running by `farmem attach` (attach.go).
	attach bool
	// inject: in the LD_PRELOAD vs injection comparison.
	inject bool
	// note goes under the table.
	note string
}

// scaled is n times scale, at least lo.
func scaled(n int, scale float64, lo int) int {
	return max(lo, int(float64(n)*scale))
}

func progDir() string { return filepath.Join(repoRoot, "workloads", "reach", "progs") }

// python3 is Debian's, which python3-numpy goes with (a pyenv shim may come first in PATH).
const python3 = "/usr/bin/python3"

// luaMusl is Lua built statically with musl from Debian's source package (deps.sh).
var luaMusl = envOr("FARMEM_REACH_LUA_MUSL", "/var/cache/farmem-reach/lua5.4-musl")

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// gofmtBin is the Go distribution's gofmt, a static Go program (CGO_ENABLED=0) written by the
// Go authors.
func gofmtBin() string {
	if p, err := exec.LookPath("gofmt"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "gofmt")
}

// checkStatic fails unless path is a statically linked ELF (no dynamic loader): the static rows
// are there to show farmem entering a program by injection.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", path)
		}
	}
	return nil
}

const (
	postgresBin = "/usr/lib/postgresql/15/bin/postgres"
	initdbBin   = "/usr/lib/postgresql/15/bin/initdb"
)

// programs is the table, in its order. Sizes at scale 1 give native runs of a few seconds and
// native peaks of 100-300 MiB on the 2-CPU machine the project runs on.
func programs() []*program {
	return []*program{
		{name: "redis", title: "redis 7: N keys SET, half rewritten, then DEBUG DIGEST", link: "dynamic",
			needs: []string{"/usr/bin/redis-server"}, server: redisServer(false), inject: true,
			argv: func(_ string, _ float64) []string {
				return []string{"/usr/bin/redis-server", "--port", "0", "--unixsocket", "@SOCK@", "--save", "", "--appendonly", "no",
					"--enable-debug-command", "yes", "--daemonize", "no", "--loglevel", "warning"}
			}},
		{name: "memcached", title: "memcached 1.6: N keys set, half rewritten, then every value read back and digested", link: "dynamic",
			needs: []string{"/usr/bin/memcached"}, server: memcachedServer(),
			argv: func(_ string, s float64) []string {
				return []string{"/usr/bin/memcached", "-s", "@SOCK@", "-m", "4096", "-t", "2", "-A", "-u", "root"}
			}},
		{name: "numpy", title: "python3 + numpy: stable sort of N int64", link: "dynamic", needs: []string{python3}, inject: true,
			argv: func(_ string, s float64) []string {
				return []string{python3, filepath.Join(progDir(), "sort.py"), strconv.Itoa(scaled(6_000_000, s, 100_000))}
			}},
		{name: "node", title: "node (V8): objects.js, small objects in a Map shuffled and relinked", link: "dynamic", needs: []string{"/usr/bin/node"},
			argv: func(_ string, s float64) []string {
				return []string{"/usr/bin/node", "--max-old-space-size=1024", "--max-semi-space-size=16",
					filepath.Join(repoRoot, "workloads", "node", "objects.js"), "--objects", strconv.Itoa(scaled(500_000, s, 20_000)), "--passes", "2"}
			},
			digest: regexp.MustCompile(`(?m)^objects: OK objects=\d+ checksum=([0-9a-f]{16})`)},
		jvm("jvm-g1", "G1"),
		jvm("jvm-parallel", "Parallel"),
		{name: "ruby", title: "ruby 3.1: an N-key Hash, half rewritten, keys sorted and digested", link: "dynamic", needs: []string{"/usr/bin/ruby"},
			argv: func(_ string, s float64) []string {
				return []string{"/usr/bin/ruby", filepath.Join(progDir(), "hash.rb"), strconv.Itoa(scaled(400_000, s, 10_000))}
			}},
		{name: "perl", title: "perl 5.36: an N-key hash, half rewritten, `sort keys` digested", link: "dynamic", needs: []string{"/usr/bin/perl"}, inject: true,
			argv: func(_ string, s float64) []string {
				return []string{"/usr/bin/perl", filepath.Join(progDir(), "hash.pl"), strconv.Itoa(scaled(400_000, s, 10_000))}
			}},
		{name: "lua", title: "lua 5.4: an N-entry table of tables shuffled, relinked and walked", link: "dynamic", needs: []string{"/usr/bin/lua5.4"},
			argv: func(_ string, s float64) []string {
				return []string{"/usr/bin/lua5.4", filepath.Join(progDir(), "shuffle.lua"), strconv.Itoa(scaled(600_000, s, 10_000))}
			}},
		{name: "sqlite3", title: "sqlite3 in memory: N rows, an index, two aggregates over the table and the index", link: "dynamic",
			needs: []string{"/usr/bin/sqlite3"}, inject: true,
			prepare: func(dir string, s float64) error {
				b, err := os.ReadFile(filepath.Join(progDir(), "index.sql"))
				if err != nil {
					return err
				}
				sql := strings.ReplaceAll(string(b), "@N@", strconv.Itoa(scaled(600_000, s, 10_000)))
				return os.WriteFile(filepath.Join(dir, "sqlite.sql"), []byte(sql), 0o644)
			},
			argv: func(dir string, _ float64) []string {
				return []string{"/usr/bin/sqlite3", "-init", filepath.Join(dir, "sqlite.sql"), ":memory:", ".quit"}
			}},
		{name: "xz", title: "xz -6 of generated text, piped to xz -d (sh, two xz processes under one cap)", link: "dynamic",
			needs: []string{"/usr/bin/xz", "/bin/sh"},
			prepare: func(dir string, s float64) error {
				return writeText(filepath.Join(dir, "xz.txt"), scaled(3<<20, s, 256<<10))
			},
			argv: func(dir string, _ float64) []string {
				return []string{"/bin/sh", "-c", `/usr/bin/xz -6 -T1 -c "$1" | /usr/bin/xz -d -c`, "sh", filepath.Join(dir, "xz.txt")}
			}},
		{name: "gcc", title: "gcc -O2 -S of a generated C file (cc1 under the driver)", link: "dynamic", needs: []string{"/usr/bin/gcc"},
			prepare: func(dir string, s float64) error {
				return writeC(filepath.Join(dir, "big.c"), scaled(40, s, 4))
			},
			argv: func(dir string, _ float64) []string {
				return []string{"/usr/bin/gcc", "-O2", "-S", "-o", "-", filepath.Join(dir, "big.c")}
			}},
		{name: "postgres", title: "postgres 15: ORDER BY of N md5 strings aggregated into one md5 (in-memory sort)", link: "dynamic",
			needs: []string{postgresBin, initdbBin, "/usr/bin/psql"}, server: postgresServer(),
			prepare: preparePostgres,
			argv: func(dir string, _ float64) []string {
				// postgres refuses to run as root: it runs as the user postgres, through asuser
				// (asuser.c), which keeps the capabilities farmem's shim needs in it.
				return []string{asuserBin(), "postgres", postgresBin, "-D", filepath.Join(dir, "pgdata"), "-k", "@SOCKDIR@",
					"-c", "listen_addresses=", "-c", "shared_buffers=8MB", "-c", "work_mem=2GB",
					"-c", "max_parallel_workers_per_gather=0", "-c", "fsync=off", "-c", "autovacuum=off", "-c", "jit=off"}
			},
			note: "postgres: its shared memory (shared_buffers 8 MiB and the rest of its main segment: the pages of it the native run's cgroup was charged at the end of the query, its `shmem`) is a shared mapping, " +
				"which farmem does not cap: farmem's cap covers the private anonymous memory of the postmaster and its backends, " +
				"where the sort's work_mem is. A memory cgroup charges the shared memory too, so the zram run's limit, and the bound of farmem's cgroup peak, " +
				"is the cap plus the native kernel memory plus that shared memory: both hold about the cap of private memory. " +
				"postgres refuses to run as root, and farmem runs as root: it is started as the user postgres through asuser " +
				"(workloads/reach/progs/asuser.c: setgid, setuid, and ambient CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, " +
				"which the shim needs to open farmem's socket and make a userfaultfd with fork events as that user)."},
		{name: "gofmt", title: "gofmt of a generated Go file (the Go distribution's static binary, CGO_ENABLED=0)", link: "static",
			needs: []string{gofmtBin()},
			prepare: func(dir string, s float64) error {
				if err := checkStatic(gofmtBin()); err != nil {
					return err
				}
				return writeGo(filepath.Join(dir, "big.go"), scaled(60_000, s, 1000))
			},
			argv: func(dir string, _ float64) []string { return []string{gofmtBin(), filepath.Join(dir, "big.go")} }},
		{name: "lua-musl", title: "lua 5.4 built statically with musl (Debian's source), the lua row's script", link: "static",
			needs:   []string{luaMusl},
			prepare: func(string, float64) error { return checkStatic(luaMusl) },
			argv: func(_ string, s float64) []string {
				return []string{luaMusl, filepath.Join(progDir(), "shuffle.lua"), strconv.Itoa(scaled(600_000, s, 10_000))}
			}},
		{name: "redis-attach", title: "redis 7 loaded natively, then capped by `farmem attach`: half the keys rewritten, DEBUG DIGEST", link: "dynamic",
			needs: []string{"/usr/bin/redis-server"}, server: redisServer(true), attach: true,
			argv: func(_ string, _ float64) []string {
				return []string{"/usr/bin/redis-server", "--port", "0", "--unixsocket", "@SOCK@", "--save", "", "--appendonly", "no",
					"--enable-debug-command", "yes", "--daemonize", "no", "--loglevel", "warning"}
			},
			note: "redis-attach: its time, everywhere, is the phase after the cap took hold (the load before it is not timed); " +
				"farmem's peak is the process's RssAnon sampled every 20 ms from the moment it first fell to the cap (before it, the pages above the cap were still going out), held to the cap; " +
				"under Linux swap the running process is moved into the memory cgroup with its charges (cgroup v1's memory.move_charge_at_immigrate) " +
				"and the limit is then lowered to the cap, which the kernel reaches by swapping out; " +
				"a kernel that moves no charges (charge moving is gone from recent kernels) has no such row."},
	}
}

// jvm is OpenJDK 17 running workloads/jvm/HeapGraph.java with collector gc, its heap fixed
// (the runs must configure the same JVM: one in a memory cgroup would size itself from it).
func jvm(name, gc string) *program {
	return &program{name: name, title: "OpenJDK 17, " + gc + " GC: HeapGraph (a HashMap graph updated in shuffled passes)", link: "dynamic",
		needs: []string{"/usr/bin/java", "/usr/bin/javac"},
		prepare: func(dir string, _ float64) error {
			// Compiled at every start, so that the class run is the source's.
			out, err := exec.Command("/usr/bin/javac", "--release", "17", "-d", filepath.Join(dir, "jvm"),
				filepath.Join(repoRoot, "workloads", "jvm", "HeapGraph.java")).CombinedOutput()
			if err != nil {
				return fmt.Errorf("javac: %v: %s", err, out)
			}
			return nil
		},
		argv: func(dir string, s float64) []string {
			heap := scaled(160, s, 32)
			args := []string{"/usr/bin/java", fmt.Sprintf("-Xms%dm", heap), fmt.Sprintf("-Xmx%dm", heap), "-XX:+Use" + gc + "GC",
				"-XX:ParallelGCThreads=2", "-XX:-UseContainerSupport", "-XX:-UsePerfData", "-XX:-UseTransparentHugePages"}
			if gc == "G1" {
				args = append(args, "-XX:ConcGCThreads=1")
			}
			return append(args, "-cp", filepath.Join(dir, "jvm"), "HeapGraph", "--entries", strconv.Itoa(heap*2500), "--passes", "2")
		},
		digest: regexp.MustCompile(`(?m)^heapgraph: OK entries=\d+ checksum=([0-9a-f]{16})`)}
}
