#!/bin/bash
# forkshell: a shell holding a 40 MB string on its heap forks 300 subshells ($(echo $i)), under
# farmem run --local-mem 16MiB, many times, with two busy loops beside it; the fork children are
# short-lived processes whose FORK events, hellos and retires come close together. A run row:
# the run, farmem's flags, farmem's exit, whether the shell's answer was right, seconds, and
# farmem's last line of output when the answer was wrong.
#
#   [FARMEM=bin] workloads/forkexec/forkshell.sh RUNS [FARMEM-FLAG...] > rows.csv   # as root, from the repository root
set -u
farmem=${FARMEM:-bin/farmem}
runs=$1
shift
busy() { while :; do :; done; }
busy & b1=$!
busy & b2=$!
trap 'kill $b1 $b2 2>/dev/null' EXIT
prog='a=$(head -c 40000000 /dev/zero | tr "\0" x); n=0; for i in $(seq 300); do x=$(echo $i); n=$((n+x)); done; echo "n=$n len=${#a}"'
echo "run,commit,flags,exit,right,seconds,said"
commit=$("$farmem" --version | sed -n "s/.*commit \([0-9a-f]*\).*/\1/p")
for r in $(seq 1 "$runs"); do
	t0=$(date +%s.%N)
	out=$(timeout 120 "$farmem" run --quiet --local-mem 16MiB "$@" -- bash -c "$prog" 2>&1)
	rc=$?
	t1=$(date +%s.%N)
	right=no
	said=
	if [ "$out" = "n=45150 len=40000000" ]; then right=yes; else said=$(echo "$out" | grep -v '^\s' | head -3 | tr '\n,"' '   '); fi
	echo "$r,$commit,$*,$rc,$right,$(echo "$t1 - $t0" | bc),\"$said\""
done
