#!/bin/bash
# farmem's own peak RSS against its store's peak with N processes each holding MIB MiB at once
# under a cap below their sum, two builds side by side (rounds interleaved): the one that keeps
# every process's pages in one arena (BEFORE, a binary) and the one with a store space a process
# (bin/farmem). Writes one row a run to rows.tsv beside this script. Run from the repository root,
# as root:  results/farmem-rss/manyproc/run.sh BEFORE [ROUNDS] [N] [MIB] [CAP]
set -euo pipefail
before=$1 rounds=${2:-2} n=${3:-40} mib=${4:-8} cap=${5:-64MiB}
dir=$(dirname "$0") tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -o "$tmp/manyproc" "$dir/manyproc.c"
printf 'round\tbuild\tversion\tprocesses\tstore_peak_bytes\tfarmem_peak_rss_bytes\toutput\n' > "$dir/rows.tsv"
for r in $(seq 1 "$rounds"); do
	for b in before spaces; do
		bin=bin/farmem
		[ "$b" = before ] && bin=$before
		out=$("$bin" run --quiet --summary-json "$tmp/s.json" --local-mem "$cap" -- "$tmp/manyproc" "$n" "$mib")
		python3 - "$tmp/s.json" "$r" "$b" "$("$bin" version)" "$out" >> "$dir/rows.tsv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("\t".join([sys.argv[2], sys.argv[3], sys.argv[4], str(s["processes"]), str(s["backend_peak_bytes"]), str(s["farmem_peak_rss_bytes"]), sys.argv[5]]))
PY
	done
done
cat "$dir/rows.tsv"
