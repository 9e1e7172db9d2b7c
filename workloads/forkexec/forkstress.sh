#!/bin/bash
# forkstress.sh RUNS [FARMEM]: many short runs of threads that fork while farmem pages, each
# ended right after a check, the pattern in which a fork child once read zeros for a page that was
# not zeros (one child in about 2,000 forks, never reproduced since). Each run is
# cmd/farmem/testdata/attachee at 32 MiB under `farmem run --local-mem 16MiB`, two threads
# forking for 2 s, every child verifying every 8th page, rewriting some and verifying them
# again, the parent verifying every page at each check; the runs take turns among forks made
# together with glibc's fork(), forks beside a thread that rewrites pages at random, and forks
# made with a raw clone(SIGCHLD). A wrong page in a child or in the parent, or an exit other than
# 0, is a failure; what farmem said on stderr is kept and counted apart. Writes one CSV row per
# run to OUT (default results/forkstress/runs.csv) and a line of totals to stdout. Needs gcc and
# root (farmem's memory cgroup).
set -euo pipefail
runs=${1:?usage: forkstress.sh RUNS [FARMEM]}
farmem=${2:-bin/farmem}
out=${OUT:-results/forkstress/runs.csv}
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gcc -O2 -pthread -o "$tmp/attachee" cmd/farmem/testdata/attachee.c
echo "run,mode,forks,bad,exit,farmem_said" >"$out"
fails=0 forks=0 said=0
for i in $(seq 1 "$runs"); do
	case $((i % 3)) in
	0) mode=together args="32 2 0" ;;
	1) mode=churning args="32 2 1" ;;
	2) mode=rawclone args="32 2 0 1" ;;
	esac
	rc=0
	res=$( (sleep 0.5; printf 'check\n'; sleep 2; printf 'check\nexit\n') |
		timeout 60 "$farmem" run --quiet --local-mem 16MiB -- "$tmp/attachee" $args 2>"$tmp/err") || rc=$?
	last=$(echo "$res" | grep '^ok ' | tail -1)
	n=$(echo "$last" | sed -n 's/.* forks \([0-9]*\) bad.*/\1/p')
	bad=$(echo "$last" | sed -n 's/.* bad \([0-9]*\)$/\1/p')
	msg=$(tr '\n,' '  ' <"$tmp/err" | cut -c1-200)
	if echo "$res" | grep -q '^BAD'; then bad=parent; fi
	echo "$i,$mode,${n:-0},${bad:-none},$rc,$msg" >>"$out"
	forks=$((forks + ${n:-0}))
	if [ "$rc" != 0 ] || [ "${bad:-none}" != 0 ]; then
		fails=$((fails + 1))
		echo "run $i ($mode): exit $rc, bad ${bad:-none}: $msg" >&2
	elif [ -n "$msg" ]; then
		said=$((said + 1))
		echo "run $i ($mode): farmem said: $msg" >&2
	fi
done
echo "forkstress: $runs runs, $forks forks checked, $fails failed, farmem said something in $said ($("$farmem" --version 2>&1 | sed -n 's/.*commit \([0-9a-f]*\).*/\1/p'))"
