#!/bin/bash
# sleeps.sh FARMEM...: where farmem's goroutines sleep while micro's random walk pages (256 MiB
# at a 64 MiB cap, two passes): the diagnosis in results/eviction.md, "The fault thread waits for
# the evictor". For each farmem binary, one run with a uprobe on runtime.gopark and call stacks:
# every time a goroutine of farmem blocks, by thread and stack (the fault thread's are the ones
# through fetcher; the others' sleeps are their own business). The run's pass rates head the list.
# Writes OUT (results/lockwait/sleeps)/COMMIT.parks.txt per binary. Needs perf and root; run on a
# quiet machine, nothing else paging.
set -euo pipefail
out=${OUT:-results/lockwait/sleeps}
mkdir -p "$out"
prog=(bin/micro --mib 256 --pattern random --passes 2)
for farmem in "$@"; do
	name=$("$farmem" --version 2>/dev/null | sed -n 's/.*commit \([0-9a-f]*\).*/\1/p')
	tmp=$(mktemp -d)
	perf probe -q -d 'probe_*:*' 2>/dev/null || true
	perf probe -q -x "$farmem" --add runtime.gopark
	ev=$(perf probe -l 2>/dev/null | awk '{print $1}' | head -1)
	{
		echo "# $farmem ($name): goroutines of farmem that blocked (runtime.gopark), by thread and stack"
		perf record -q -e "$ev" -g -o "$tmp/gp.data" -- "$farmem" run --quiet --local-mem 64MiB -- "${prog[@]}" 2>&1 | grep pass
		perf script -i "$tmp/gp.data" -F tid,ip,sym 2>/dev/null |
			awk 'BEGIN{RS=""} {n=split($0,L,"\n"); k=""; for(i=3;i<=n && i<=7;i++){split(L[i],f," "); k=k" < "f[2]} print $1 k}' |
			sed 's/github.com\/farmem\/farmem\///g' | sort | uniq -c | sort -rn | head -20
	} >"$out/$name.parks.txt"
	perf probe -q -d 'probe_*:*'
	rm -rf "$tmp"
done
