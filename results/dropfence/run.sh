#!/bin/bash
# The integrity torture (forks, munmap, mremap, realloc, discards) under farmem at a 16 MiB cap,
# this build against an earlier one (BEFORE, a farmem binary), interleaved; one row a run:
# the build, the round, wall seconds, torture's verdict, and the summary's eviction batches,
# those whose drop way was given up (aborted) and, of those, at the commit (unsettled).
# Usage, from the repository root: results/dropfence/run.sh BEFORE ROUNDS [FARMEM-FLAG...]
# (the flags go to farmem run, as in --serve-faults program, and are named in each row).
set -u
before=$1 rounds=$2
shift 2
echo "build,commit,flags,round,seconds,verdict,batches,aborted,unsettled,stale,staged,removes"
for r in $(seq 1 "$rounds"); do
	for build in after before; do
		bin=bin/farmem
		[ "$build" = before ] && bin=$before
		commit=$($bin --version | sed -n 's/.*commit \([0-9a-f]*\).*/\1/p')
		s=$(mktemp)
		t0=$(date +%s.%N)
		out=$($bin run --quiet --summary-json "$s" --local-mem 16MiB "$@" -- bin/torture --quiet --mib 96 --rounds 20 2>&1)
		t1=$(date +%s.%N)
		verdict=$(echo "$out" | grep -o 'torture: OK\|torture: FAILED[^ ]*' | head -1)
		[ -z "$verdict" ] && verdict="no verdict"
		b=$(python3 -c "
import json,sys
s=json.load(open('$s'))['batches']
print(','.join(str(s.get(k,'')) for k in ('count','aborted','unsettled','stale','staged','removes')))" 2>/dev/null || echo ",,,,,")
		echo "$build,$commit,$*,$r,$(echo "$t1 - $t0" | bc),$verdict,$b"
		rm -f "$s"
	done
done
