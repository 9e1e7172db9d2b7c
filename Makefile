# farmem: `make build` builds bin/farmem (the preload shim and the static programs' agent are embedded in it);
# `make test` runs every test (as root: userfaultfd, /proc of other processes).
GO      ?= go
CC      ?= gcc
SHIM    := launcher/shim/libfarmem.so

.PHONY: build test shim workloads clean bench bench-smoke fuzz
# The commit `farmem version` reports, -dirty if tracked files differ from it; empty outside a
# git checkout. Stamped by -ldflags because GOFLAGS may hold -buildvcs=false.
COMMIT  := $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git rev-parse --git-dir >/dev/null 2>&1 && ! git diff --quiet HEAD -- 2>/dev/null && echo -dirty)
build: shim workloads
	$(GO) build -ldflags "-X main.commit=$(COMMIT)" -o bin/farmem ./cmd/farmem

AGENT   := launcher/shim/agent.elf
shim: $(SHIM) $(AGENT)
$(SHIM): launcher/shim/shim.c launcher/shim/agent.h
	$(CC) -O2 -fPIC -shared -Wall -Wextra -o $@ $< -lpthread
# The agent farmem injects into static programs: freestanding, position independent, and with no
# relocation to apply, so that farmem can map it anywhere with no loader (launcher/agentimage.go checks).
$(AGENT): launcher/shim/agent.c launcher/shim/agent.h
	$(CC) -Os -Wall -Wextra -ffreestanding -fno-builtin -fno-stack-protector -fcf-protection=none \
		-fno-asynchronous-unwind-tables -fPIC -fvisibility=hidden -nostdlib -static-pie \
		-Wl,--no-dynamic-linker,-z,noexecstack,--build-id=none,-e,fm_start_entry -o $@ $<

workloads: bin/torture bin/micro bin/pagerank bin/redisdrive bin/memcachedrive bin/floorpager bin/forkexec bin/computing
# The floor of paging: a minimal C userfaultfd pager and its preload shim (workloads/floor).
bin/floorpager: workloads/floor/floorpager.c workloads/floor/floorcore.h workloads/floor/floor.h bin/floorshim.so
	@mkdir -p bin
	$(CC) -O2 -Wall -Wextra -pthread -o $@ workloads/floor/floorpager.c
bin/floorshim.so: workloads/floor/floorshim.c workloads/floor/floorcore.h workloads/floor/floor.h
	@mkdir -p bin
	$(CC) -O2 -fPIC -shared -Wall -Wextra -pthread -o $@ workloads/floor/floorshim.c
bin/torture: workloads/torture/torture.c
	@mkdir -p bin
	$(CC) -O2 -Wall -pthread -o $@ $<
bin/micro: workloads/micro/micro.c
	@mkdir -p bin
	$(CC) -O2 -Wall -o $@ $< -lm

bin/forkexec: workloads/forkexec/forkexec.c
	@mkdir -p bin
	$(CC) -O2 -Wall -o $@ $<

bin/computing: workloads/gather/computing.c
	@mkdir -p bin
	$(CC) -O2 -Wall -Wextra -pthread -o $@ $<

bin/pagerank: workloads/graph/pagerank.c
	@mkdir -p bin
	$(CC) -O2 -Wall -o $@ $<
.PHONY: bin/redisdrive
bin/redisdrive:
	@mkdir -p bin
	$(GO) build -o $@ ./workloads/bench/redisdrive
.PHONY: bin/memcachedrive
bin/memcachedrive:
	@mkdir -p bin
	$(GO) build -o $@ ./workloads/bench/memcachedrive

# The benchmark harness is a Go module of its own, which `./...` does not reach: its tests run too.
# The tests' programs and Jaeger are installed or built once (scripts/test-deps.sh), then reused.
FARMEM_JAEGER ?= /var/cache/farmem-jaeger/jaeger-v1.76.0
export FARMEM_JAEGER
FARMEM_ETCD ?= /var/cache/farmem-etcd/etcd-v3.7.3
export FARMEM_ETCD
.PHONY: test-deps
test-deps:
	scripts/test-deps.sh

test: build test-deps
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 45m ./...
	cd workloads/bench/harness && $(GO) vet ./... && $(GO) test -count=1 ./...

clean:
	rm -rf bin $(SHIM) $(AGENT)

# Fuzz the memory server's frame decoding (FUZZTIME each). The tests replay the kept corpus in
# fabric/testdata/fuzz; after a run, copy new finds there from $(GO) env GOCACHE's fuzz dir.
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run XXX -fuzz FuzzServe -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./fabric/
	$(GO) test -run XXX -fuzz FuzzParseHeader -fuzztime $(FUZZTIME) ./fabric/

# Benchmarks write to results/; not part of the tests. bench-smoke is the short CI-sized run.
bench: build bench-fabric bench-swap
	workloads/bench/redis.sh 300000 100000

bench-smoke: build bin/bench-fabric
	ROUNDS=1 OUT=/tmp/farmem-bench-smoke.md workloads/bench/redis.sh 60000 5000
	bin/bench-fabric -n 2000 -batches 20 -faults 1000 -rounds 1 -out /tmp/farmem-bench-fabric-smoke.md
	SCALE=0.25 ROUNDS=1 CAPS=25 OUT=/tmp/farmem-bench-prefetch-smoke.md workloads/bench/prefetch.sh
	$(MAKE) bench-swap-smoke

# farmem against Linux swap (issue 6): each workload natively, under farmem at 100/75/50/25 % of
# its native peak (default prefetcher, leap, and --prefetch none) and in a memory cgroup with that limit swapping to
# zram and to a swap file, the micro walks also under bin/floorpager (the floor of paging), ROUNDS (3) rounds interleaved, every run verified (about 25 minutes,
# as root): results/swap.md, swap.csv, swap-*.png. farmem-bench -h for its flags (FLAGS=...).
# The harness is a Go module of its own (workloads/bench/harness), so that the plotting
# library's dependencies stay out of farmem's go.mod.
.PHONY: bench-swap bench-swap-smoke bin/farmem-bench
bench-swap: build bin/farmem-bench
	bin/farmem-bench $(FLAGS)
	@$(MAKE) --no-print-directory swap-check
# The floor of paging beside farmem and zram, on the micro walks only (results/floor/swap.md,
# its section "The floor"); bench-swap runs the floor configuration too. floor-inproc is the same
# pager served from within the program (results/inproc.md).
.PHONY: bench-floor
bench-floor: build bin/farmem-bench
	bin/farmem-bench -workloads micro-random,micro-seq -configs floor,floor-inproc,farmem,farmem-none,swap-zram -nopaging 0 -out results/floor $(FLAGS)
	@$(MAKE) --no-print-directory swap-check
# The CI-sized swap run: one round, 32 MiB micro random and a small redis, one cap, zram only
# (under a minute on an idle machine). It fails if the swap setup fails, and checks nothing was left on.
bench-swap-smoke: build bin/farmem-bench
	ROUNDS=1 bin/farmem-bench -workloads micro-random,redis-etc -caps 50 -configs farmem,swap-zram -nopaging 0 -scale 0.5 -out /tmp/farmem-bench-swap-smoke
	@$(MAKE) --no-print-directory swap-check
bin/farmem-bench: $(wildcard workloads/bench/harness/*.go)
	@mkdir -p bin
	cd workloads/bench/harness && $(GO) vet . && $(GO) build -o ../../../bin/farmem-bench .
# No swap, zram device or benchmark cgroup may outlive a benchmark.
.PHONY: swap-check
swap-check:
	@if [ "$$(wc -l </proc/swaps)" -gt 1 ] || ls -d /sys/fs/cgroup/memory/farmem-swap-* /sys/fs/cgroup/farmem-swap-* 2>/dev/null | grep -q .; then \
		echo "swap or a farmem-swap cgroup was left behind:"; cat /proc/swaps; ls -d /sys/fs/cgroup/memory/farmem-swap-* /sys/fs/cgroup/farmem-swap-* 2>/dev/null; exit 1; fi

# The reach table: unmodified programs (redis, memcached, numpy, node, the JVM, ruby, perl, lua,
# sqlite3, xz, gcc, postgres, a static Go and a musl program, one attached while running) natively,
# under Linux swap to zram and under farmem at 25 % of their native peak, outputs checked (about
# 15 minutes, as root, on a quiet machine): results/reach.md and reach.csv. FLAGS: bin/farmem-reach -h.
.PHONY: bench-reach bin/farmem-reach
bench-reach: build bin/farmem-reach
	scripts/reach-deps.sh
	bin/farmem-reach $(FLAGS)
	@$(MAKE) --no-print-directory swap-check
bin/farmem-reach:
	@mkdir -p bin
	$(GO) build -o $@ ./workloads/reach

# The prefetchers (issue 4): fault traces replayed by farmem sim and end-to-end runs of micro,
# redis and pagerank at 50 % and 25 % caps with each prefetcher (under 20 minutes, as root):
# results/prefetch.md. SCALE, ROUNDS, WORKLOADS, CAPS, OUT: see the script.
.PHONY: bench-prefetch
bench-prefetch: build
	workloads/bench/prefetch.sh

# farmem's victim choice against LRU and Belady's MIN on each workload's own access stream (issue
# 18), at 50 % and 25 % caps: results/replay.md and replay.csv (a few minutes, as root).
.PHONY: bench-replay
bench-replay: build
	workloads/replay/replay.sh

# farmem's write guess: --write-guess auto against last on xz and the JVM, side by side
# (ROUNDS rounds, 3 by default; about 3 minutes), into results/writeguess.
bench-writeguess: build
	OUT=results/writeguess workloads/bench/writeguess.sh

# The transports (tcp, shm) against the raw floors measured in the same run (about 20 s, as root:
# the fault-service table needs userfaultfd): results/fabric.md, and its raw rows (every path's
# every round, with its latency histogram) in results/fabric.csv.
.PHONY: bench-fabric bin/bench-fabric bench-writeguess
bench-fabric: bin/bench-fabric
	bin/bench-fabric -commit $(COMMIT) -out results/fabric.md
bin/bench-fabric:
	@mkdir -p bin
	$(GO) build -o $@ ./workloads/bench/fabric

# The ctrl's store (file, etcd of 1 and 3 members): slab placement and re-replication latency, real
# ctrl, etcd and memory servers on loopback, interleaved rounds (about a minute): a section of
# results/fabric.md and results/fabric-ctrl.csv. Needs the etcd of scripts/test-deps.sh.
.PHONY: bench-ctrl bin/bench-ctrl
bench-ctrl: build bin/bench-ctrl
	bin/bench-ctrl -commit $(COMMIT) $(FLAGS)
bin/bench-ctrl:
	@mkdir -p bin
	$(GO) build -o $@ ./workloads/bench/ctrl

# The ctrl past this machine, by simulation: its state machine driven at 1,000 memory servers and
# 10,000 sessions with churn and rack losses, the etcd store's transactions counted (no etcd):
# results/ctrlsim/ (CSVs, ctrlsim.md, ctrlsim.svg). The ctrl's own placement and saves make the full
# run take tens of minutes of CPU (one core); FLAGS="-servers 100 -rack 10 -sessions 1000 -out DIR"
# is a one-minute run.
.PHONY: bench-ctrlsim
bench-ctrlsim:
	$(GO) run ./workloads/ctrlsim -commit $(COMMIT) $(FLAGS)

# The rdma transport's tests, for real: boots Debian's 6.1 kernel under qemu (TCG) with rdma_rxe
# on a dummy netdev and runs the C probe and `go test -tags rdma ./fabric/` inside it (as root;
# installs qemu-system-x86, busybox-static, libibverbs-dev... when missing). Not part of `test`.
.PHONY: test-rdma
test-rdma:
	GO=$(GO) workloads/rdma/test-rdma.sh

# farmem on a cgroup v2-only machine, for real: boots Debian's kernel under qemu (TCG) with
# cgroup_no_v1=all and runs the watch's tests, a capped run, a run armed by the cgroup watch and
# linux-swap.sh beside farmem inside it (as root; installs qemu-system-x86, busybox-static...
# when missing). Not part of `test`.
.PHONY: test-cgroup2
test-cgroup2:
	GO=$(GO) workloads/cgroup2/test-cgroup2.sh
