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

import "github.com/farmem/farmem/workloads/bench/ycsb"

func main() { ycsb.Main("redisdrive", "redis-server", "127.0.0.1:6379", "GET", "SET", &ycsb.RESP{}) }
