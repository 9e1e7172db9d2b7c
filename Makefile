# farmem: `make build` builds bin/farmem (the preload shim is embedded in it);
# `make test` runs every test (as root: userfaultfd, /proc of other processes).
GO      ?= go
CC      ?= gcc
SHIM    := launcher/shim/libfarmem.so

.PHONY: build test shim workloads clean bench bench-smoke fuzz
build: shim workloads
	$(GO) build -o bin/farmem ./cmd/farmem

shim: $(SHIM)
$(SHIM): launcher/shim/shim.c
	$(CC) -O2 -fPIC -shared -Wall -Wextra -o $@ $< -lpthread

workloads: bin/torture bin/micro bin/pagerank bin/redisdrive
bin/torture: workloads/torture/torture.c
	@mkdir -p bin
	$(CC) -O2 -Wall -pthread -o $@ $<
bin/micro: workloads/micro/micro.c
	@mkdir -p bin
	$(CC) -O2 -Wall -o $@ $<
bin/pagerank: workloads/graph/pagerank.c
	@mkdir -p bin
	$(CC) -O2 -Wall -o $@ $<
.PHONY: bin/redisdrive
bin/redisdrive:
	@mkdir -p bin
	$(GO) build -o $@ ./workloads/bench/redisdrive

test: build
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 45m ./...

clean:
	rm -rf bin $(SHIM)

# Fuzz the memory server's frame decoding (FUZZTIME each). The tests replay the kept corpus in
# fabric/testdata/fuzz; after a run, copy new finds there from $(GO) env GOCACHE's fuzz dir.
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run XXX -fuzz FuzzServe -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./fabric/
	$(GO) test -run XXX -fuzz FuzzParseHeader -fuzztime $(FUZZTIME) ./fabric/

# Benchmarks write to results/; not part of the tests. bench-smoke is the short CI-sized run.
bench: build bench-fabric
	workloads/bench/redis.sh 300000 100000

bench-smoke: build bin/bench-fabric
	ROUNDS=1 OUT=/tmp/farmem-bench-smoke.md workloads/bench/redis.sh 60000 5000
	bin/bench-fabric -n 2000 -batches 20 -faults 1000 -rounds 1 -out /tmp/farmem-bench-fabric-smoke.md
	SCALE=0.25 ROUNDS=1 CAPS=25 OUT=/tmp/farmem-bench-prefetch-smoke.md workloads/bench/prefetch.sh

# The prefetchers (issue 4): fault traces replayed by farmem sim and end-to-end runs of micro,
# redis and pagerank at 50 % and 25 % caps with each prefetcher (under 20 minutes, as root):
# results/prefetch.md. SCALE, ROUNDS, WORKLOADS, CAPS, OUT: see the script.
.PHONY: bench-prefetch
bench-prefetch: build
	workloads/bench/prefetch.sh

# The transports (tcp, shm) against the raw floors measured in the same run (about 20 s, as root:
# the fault-service table needs userfaultfd): results/fabric.md.
.PHONY: bench-fabric bin/bench-fabric
bench-fabric: bin/bench-fabric
	bin/bench-fabric -out results/fabric.md
bin/bench-fabric:
	@mkdir -p bin
	$(GO) build -o $@ ./workloads/bench/fabric

# The rdma transport's tests, for real: boots Debian's 6.1 kernel under qemu (TCG) with rdma_rxe
# on a dummy netdev and runs the C probe and `go test -tags rdma ./fabric/` inside it (as root;
# installs qemu-system-x86, busybox-static, libibverbs-dev... when missing). Not part of `test`.
.PHONY: test-rdma
test-rdma:
	GO=$(GO) workloads/rdma/test-rdma.sh
