#!/bin/bash
# computing.sh: what holding a program's faulting threads on one CPU (runtime/gather.go) does to
# a program whose threads compute between their faults, the case it must not make slower.
# bin/computing (workloads/gather/computing.c) runs THREADS (2) threads over MIB (128) MiB with
# ITERS (50000) touches each after SPIN (30000) rounds of arithmetic, at a cap of half its memory,
# and checks every byte at the end. Configurations: native, farmem (bin/farmem), and each
# NAME=BINARY of BUILDS (other farmem builds, say an earlier one), ROUNDS (5) interleaved rounds
# in a shuffled order. A run whose check fails, or that exits non-zero, is counted failed, never
# timed.
#
# Writes OUT (results/gather/computing)/rows.csv, a row per run, and OUT/README.md: the command,
# each build's version, the machine's load, and medians over the runs that finished.
# Run from the repository root after `make build workloads`, on a quiet machine:
#   BUILDS="before=/tmp/old/bin/farmem" workloads/gather/computing.sh
set -euo pipefail
out=${OUT:-results/gather/computing}
rounds=${ROUNDS:-5}
threads=${THREADS:-2} mib=${MIB:-128} iters=${ITERS:-50000} spin=${SPIN:-30000}
cap=$((mib / 2))
mkdir -p "$out"
rows=$out/rows.csv
declare -A bin=([farmem]=bin/farmem)
for b in ${BUILDS:-}; do bin[${b%%=*}]=${b#*=}; done
started=$(date -u '+%Y-%m-%d %H:%M UTC')
load0=$(cut -d' ' -f1-3 /proc/loadavg)
t0=$(date +%s)
echo "round,config,seconds,status" >"$rows"
prog=(bin/computing "$threads" "$mib" "$iters" "$spin")
for r in $(seq "$rounds"); do
	mapfile -t order < <(printf '%s\n' native "${!bin[@]}" | shuf)
	for cfg in "${order[@]}"; do
		if [ "$cfg" = native ]; then cmd=("${prog[@]}"); else cmd=("${bin[$cfg]}" run --quiet --local-mem "${cap}MiB" -- "${prog[@]}"); fi
		status=ok
		line=$("${cmd[@]}" 2>&1 | grep '^computing:' | tail -1) || status=failed
		case $line in *", OK") ;; *) status=failed ;; esac
		secs=$(sed -n 's/.*threads, \([0-9.]*\) s,.*/\1/p' <<<"$line")
		echo "$r,$cfg,${secs:--},$status" >>"$rows"
		echo "computing.sh: round $r $cfg: $line ($status)" >&2
	done
done
{
	echo "# Computing threads, held on one CPU or not"
	echo
	echo "Command: \`$(for v in BUILDS ROUNDS THREADS MIB ITERS SPIN; do [ -z "${!v:-}" ] || printf '%s=%q ' "$v" "${!v}"; done)workloads/gather/computing.sh\`, started $started, took $(($(date +%s) - t0)) s, at $(git rev-parse --short=12 HEAD)$([ -z "$(git status --porcelain --untracked-files=no)" ] || echo ' with uncommitted changes')."
	echo "Load average at the start: $load0; at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
	echo
	echo "\`${prog[*]}\` natively and under \`farmem run --local-mem ${cap}MiB\`; every run checks every byte of its buffer. Builds:"
	echo
	for c in "${!bin[@]}"; do echo "- $c: \`${bin[$c]}\`, $("${bin[$c]}" version)"; done
	echo
	echo "| config | median s | runs finished | failed | x native |"
	echo "|---|---|---|---|---|"
	med() { sort -n | awk '{a[NR]=$1} END {if (NR) printf "%.2f", (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
	nat=$(awk -F, '$2=="native" && $4=="ok" {print $3}' "$rows" | med)
	for c in native "${!bin[@]}"; do
		m=$(awk -F, -v c="$c" '$2==c && $4=="ok" {print $3}' "$rows" | med)
		n=$(awk -F, -v c="$c" '$2==c && $4=="ok"' "$rows" | wc -l)
		f=$(awk -F, -v c="$c" '$2==c && $4!="ok"' "$rows" | wc -l)
		x=-
		[ -z "$m" ] || [ -z "$nat" ] || x=$(awk -v m="$m" -v n="$nat" 'BEGIN {printf "%.2f", m/n}')
		echo "| $c | ${m:--} | $n | $f | $x |"
	done
	echo
	echo "Rows: [rows.csv](rows.csv) (seconds: the threads' wall time, the fill and the check not included)."
} >"$out/README.md"
cat "$out/README.md"
