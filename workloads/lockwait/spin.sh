#!/bin/bash
# spin.sh: how long the fault thread should spin for the page table's lock before it sleeps
# (pagetable/lock.go, faultSpin). Builds farmem from HEAD with each SPINS value (µs; a copy of the
# tree with the constant changed), then runs micro's random walk (256 MiB at a 64 MiB cap, two
# verified passes) under each, ROUNDS (3) interleaved rounds, and counts where the fault thread
# slept in one more run of each (a uprobe on runtime.gopark, as sleeps.sh).
# Writes OUT (results/lockwait/spin)/rows.csv (round, spin_us, pass, pages_per_sec) and
# OUT/sleeps.txt. Run from the repository root as root after `make build`, on a quiet machine.
set -euo pipefail
out=${OUT:-results/lockwait/spin}
spins=${SPINS:-20 50 100 200}
rounds=${ROUNDS:-3}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive HEAD | tar -x -C "$tmp"
cp launcher/shim/libfarmem.so launcher/shim/agent.elf "$tmp/launcher/shim/" # built by make build
for s in $spins; do
	sed -i "s/^const faultSpin = .*/const faultSpin = $s * time.Microsecond/" "$tmp/pagetable/lock.go"
	(cd "$tmp" && go build -o "$tmp/farmem-$s" ./cmd/farmem)
done
prog=(bin/micro --mib 256 --pattern random --passes 2)
echo "round,spin_us,pass,pages_per_sec" >"$out/rows.csv"
for r in $(seq "$rounds"); do
	for s in $(printf '%s\n' $spins | shuf); do
		"$tmp/farmem-$s" run --quiet --local-mem 64MiB -- "${prog[@]}" |
			sed -n "s/^micro: pass\([12]\) .*pages_per_sec=\([0-9]*\).*/$r,$s,\1,\2/p" >>"$out/rows.csv"
	done
done
: >"$out/sleeps.txt"
for s in $spins; do
	perf probe -q -d 'probe_*:*' 2>/dev/null || true
	perf probe -q -x "$tmp/farmem-$s" --add runtime.gopark
	ev=$(perf probe -l 2>/dev/null | awk '{print $1}' | head -1)
	perf record -q -e "$ev" -g -o "$tmp/gp.data" -- "$tmp/farmem-$s" run --quiet --local-mem 64MiB -- "${prog[@]}" >/dev/null 2>&1
	n=$(perf script -i "$tmp/gp.data" -F tid,ip,sym 2>/dev/null |
		awk 'BEGIN{RS=""} /fetcher\./ {n++} END {print n+0}')
	echo "spin $s µs: the fault thread slept $n times" >>"$out/sleeps.txt"
	perf probe -q -d 'probe_*:*'
done
echo "commit $(git rev-parse --short=12 HEAD)" >>"$out/sleeps.txt"
python3 - "$out/rows.csv" <<'PY'
import csv, sys, statistics as st
from collections import defaultdict
d = defaultdict(list)
for r in csv.DictReader(open(sys.argv[1])):
    d[int(r['spin_us'])].append(int(r['pages_per_sec']))
for s in sorted(d):
    print("spin %d µs: median %d pages/s over %d passes" % (s, st.median(d[s]), len(d[s])))
PY
