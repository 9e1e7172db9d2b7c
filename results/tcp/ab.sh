#!/bin/bash
# ab.sh ROUNDS CONFIG... : redis ETC as farmem-bench runs it at -scale 1 (redisdrive --keys 46000
# --ops 184000 --get-ratio 0.95, 1000 B values, zipfian) under farmem run at a 31 MiB cap (50 %
# of its 62 MiB native peak), rounds interleaved, one row per run on stdout (results/tcp/why.md).
#
# CONFIG is NAME:BINARY[:ENV[:MEMSERVER FLAGS]]. A NAME starting with emb runs the embedded store;
# any other a fresh ctrl and one memory server on loopback for each run (4 MiB slabs, as
# farmem-bench's farmem-tcp), both from BINARY, the memory server with MEMSERVER FLAGS (e.g.
# --spin 200us). ENV (VAR=VALUE, space-separated) is farmem run's environment.
# Run as root from the repository root, with bin/redisdrive built (make build).
set -u
ROUNDS=$1; shift
W=$(mktemp -d /tmp/tcpab.XXXX)
head -c 32 /dev/urandom | xxd -p -c 64 > $W/token
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
echo "# $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
trap '[ -n "${CTRLPID:-}" ] && kill $CTRLPID 2>/dev/null; [ -n "${MSPID:-}" ] && kill $MSPID 2>/dev/null; wait' EXIT
printf "config\tcommit\tround\tops_per_sec\twall_s\tbackend_faults\tfault_p50_us\tfault_p99_us\tfault_sum_s\theld_s\tprefetch_issued\tprefetch_placed\tpages_in\n"
for r in $(seq 1 $ROUNDS); do
for c in "$@"; do
  IFS=':' read -r name bin envs msflags <<<"$c"
  commit=$($bin version | sed -n 's/.*commit \([0-9a-f]*\).*/\1/p' | cut -c1-7)
  extra=()
  if [[ "$name" != emb* ]]; then
    SP=$(port); CP=$(port); rm -rf $W/state
    $bin ctrl --listen 127.0.0.1:$CP --state $W/state --token-file $W/token --slab-size 4MiB --dead-after 60s >$W/ctrl.log 2>&1 &
    CTRLPID=$!
    $bin memserver --listen 127.0.0.1:$SP --capacity 4GiB --ctrl 127.0.0.1:$CP --token-file $W/token ${msflags:-} >$W/ms.log 2>&1 &
    MSPID=$!
    for i in $(seq 100); do
      $bin status --ctrl 127.0.0.1:$CP --token-file $W/token 2>/dev/null | grep -q "1 healthy of 1" && break
      kill -0 $MSPID 2>/dev/null || { echo "the memory server of $c did not start:" >&2; cat $W/ms.log >&2; exit 1; }
      sleep 0.2
    done
    extra=(--ctrl 127.0.0.1:$CP --token-file $W/token)
  fi
  dd if=/dev/zero of=/dev/null bs=160M count=1 2>/dev/null
  RP=$(port)
  env ${envs:-} $bin run --local-mem 31MiB --summary-json $W/sum.json "${extra[@]}" -- redis-server --port $RP --bind 127.0.0.1 --save "" --appendonly no >$W/srv.log 2>&1 &
  FP=$!
  t0=$(date +%s.%N)
  out=$(bin/redisdrive --addr 127.0.0.1:$RP --keys 46000 --ops 184000 --get-ratio 0.95 --wait 30s 2>&1)
  t1=$(date +%s.%N)
  redis-cli -p $RP shutdown nosave >/dev/null 2>&1; wait $FP
  echo "$out" | grep -q "redisdrive: OK" || { echo "VERIFY FAILED $c: $out" >&2; tail $W/srv.log >&2; exit 1; }
  ops=$(echo "$out" | sed -n 's/^redisdrive: run .* ops_per_sec=\([0-9]*\)$/\1/p')
  python3 - "$name" "$commit" $r "$ops" $t0 $t1 $W/sum.json <<'PY'
import json,sys
c,commit,r,ops,t0,t1,p=sys.argv[1:]
s=json.load(open(p)); f=s["faults"].get("backend",{})
held=sum(v.get("sum_ns",0) for v in s.get("held",{}).values())
pf=s["prefetch"]
print("\t".join(map(str,[c,commit,r,ops,"%.2f"%(float(t1)-float(t0)),f.get("count"),f.get("p50_ns",0)/1e3,f.get("p99_ns",0)/1e3,
  "%.3f"%(f.get("sum_ns",0)/1e9),"%.3f"%(held/1e9),pf["issued"],pf["placed"],s["bytes_in"]//4096])))
PY
  if [[ "$name" != emb* ]]; then kill $MSPID; wait $MSPID 2>/dev/null; MSPID=; kill $CTRLPID; wait $CTRLPID 2>/dev/null; CTRLPID=; fi
done; done
