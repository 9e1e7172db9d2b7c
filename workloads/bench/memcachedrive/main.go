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

import "github.com/farmem/farmem/workloads/bench/ycsb"

func main() {
	ycsb.Main("memcachedrive", "memcached", "127.0.0.1:11211", "get", "set", &ycsb.MemcachedText{})
}
