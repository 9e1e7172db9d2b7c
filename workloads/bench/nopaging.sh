#!/bin/bash
# nopaging.sh CAP...: issue 6's no-paging target on redis, with a zipfian phase 10x longer than
# the harness's (460k operations, ~2.6 s natively, where the harness's ~0.3 s phase is mostly
# noise). Each round runs redis natively, then under `bin/farmem run --local-mem CAP` for each
# CAP, and prints the zipfian phase's ops/s and whether farmem armed. ROUNDS (3), GET_RATIO
# (0.95: ETC; 0.75: SYS). FARMEMS: the farmem binaries to compare, each run at each CAP in every
# round (bin/farmem). Run from the repository root after `make build`, on an idle machine:
#   workloads/bench/nopaging.sh 93MiB 1GiB     # 150 % of redis's 62 MiB peak, and far above
#   FARMEMS="/tmp/farmem-before bin/farmem" workloads/bench/nopaging.sh 93MiB
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 CAP..." >&2; exit 2; }
log=$(mktemp)
sum=$(mktemp)
trap 'rm -f "$log" "$sum"' EXIT
one() { # PREFIX...: the zipfian phase's ops/s
	local port=$((20000 + RANDOM % 20000))
	"$@" redis-server --port $port --bind 127.0.0.1 --save "" --appendonly no >"$log" 2>&1 &
	local srv=$!
	bin/redisdrive --addr 127.0.0.1:$port --keys 46000 --ops 460000 --get-ratio "${GET_RATIO:-0.95}" --wait 30s |
		sed -n 's/^redisdrive: run .*ops_per_sec=\([0-9]*\).*/\1/p'
	kill -TERM $srv
	wait $srv || true
}
for r in $(seq "${ROUNDS:-3}"); do
	line="round $r native $(one env)"
	for cap in "$@"; do
		for bin in ${FARMEMS:-bin/farmem}; do
			line="$line | $bin $cap $(one "$bin" run --summary-json "$sum" --local-mem "$cap" --) ($(jq -r 'if .armed then "armed at \(.armed_at_bytes) bytes" else "not armed" end' "$sum"))"
		done
	done
	echo "$line"
done
