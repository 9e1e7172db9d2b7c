#!/bin/bash
# eviction-ab.sh NAME=FARMEM... : the eviction comparison of results/eviction.md, side by side.
# For each round (ROUNDS, default 3) and each build in turn: micro's random walk over 64 MiB at a
# 16 MiB cap (pass 2's pages/s, the eviction batches' runs and p50), then redis-server at 31 MiB
# (half its peak) driven by redisdrive's ETC mix (the zipfian phase's ops/s, backend faults).
# Run from the repository root after `make build`, on an otherwise idle machine, e.g.
#   git worktree add /tmp/base ca92213 && make -C /tmp/base build
#   workloads/bench/eviction-ab.sh base=/tmp/base/bin/farmem new=bin/farmem
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 NAME=FARMEM_BINARY..." >&2; exit 2; }
for b in "$@"; do [ -x "${b#*=}" ] || { echo "$0: ${b#*=} is not an executable farmem" >&2; exit 2; }; done
log=$(mktemp)
sum=$(mktemp)
trap 'rm -f "$log" "$sum"' EXIT
# batches FARMEM: the flags that make FARMEM say what its eviction batches did, and then what it
# said: --summary-json where the build has it (read with jq), else its summary on stderr.
flags() { "$1" run --help 2>&1 | grep -q -- --summary-json && echo "--summary-json $sum" || true; }
said() {
	if [ -s "$sum" ]; then
		jq -r '"eviction batches \(.batches.count) (\(.batches.runs / ([.batches.count, 1] | max) | floor) runs each) p50 \(.batches.latency.p50_ns / 1000 | floor)µs backend \(.faults.backend.count)"' "$sum"
	else
		grep -o 'eviction batches [0-9]* ([^)]*) p50 [^ ]*\|backend [0-9]* p50' "$log" | tr '\n' ' '
	fi
	: >"$sum"
}
redis() { # FARMEM: prints ops/s, then the summary's batches and backend faults
	local port=$((20000 + RANDOM % 20000))
	# shellcheck disable=SC2046
	"$1" run --local-mem 31MiB $(flags "$1") -- redis-server --port $port --bind 127.0.0.1 --save "" --appendonly no >"$log" 2>&1 &
	local srv=$!
	bin/redisdrive --addr 127.0.0.1:$port --keys 46000 --ops 46000 --get-ratio 0.95 --wait 30s |
		sed -n 's/^redisdrive: run .*ops_per_sec=\([0-9]*\).*/\1/p' | tr '\n' ' '
	kill -TERM $srv
	wait $srv || true
	said "$1"
	echo
}
for r in $(seq "${ROUNDS:-3}"); do
	for b in "$@"; do
		name=${b%%=*} f=${b#*=}
		# shellcheck disable=SC2046
		timeout 300 "$f" run --local-mem 16MiB $(flags "$f") -- bin/micro --mib 64 --pattern random --passes 2 >"$log" 2>&1 || true
		echo "round $r $name micro: $(grep -o 'pass2 .*pages_per_sec=[0-9]*' "$log") $(said "$f")"
		echo "round $r $name redis: $(redis "$f")"
	done
done
