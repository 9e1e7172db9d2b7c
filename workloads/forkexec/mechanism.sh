#!/bin/bash
# mechanism.sh: what each of farmem's two ways into a dynamic program costs a program that makes
# processes: the preloaded shim (farmem run's default for a dynamic program) against injection
# through ptrace (`farmem run --inject`, the way into a static one), side by side with the
# program alone. bin/forkexec (workloads/forkexec/forkexec.c) holds 64 MiB and forks N times
# ("fork": each child checks pages of its copy) or forks and execs /bin/true N times ("exec"),
# at a cap of half its memory (32 MiB: paging, armed) and far above it (512 MiB: never armed).
# ROUNDS (5) rounds, interleaved: each round runs every workload in every configuration once,
# in a shuffled order. Every run's own check must pass (its "OK" line, exit 0), or the run is
# counted failed, never timed.
#
# BEFORE, if set, is another farmem binary (an earlier build) run with the shim beside the rest
# in every round ("before"), so that a change to what a fork costs is measured side by side.
#
# Writes OUT (results/mechanism)/rows.csv, a row per run, and OUT/README.md: the command, the
# commit, the machine's load, medians over the runs that finished and the failures beside them.
# Run from the repository root after `make build workloads`, on a quiet machine:
#   workloads/forkexec/mechanism.sh
#   BEFORE=/tmp/farmem-old workloads/forkexec/mechanism.sh
set -euo pipefail
out=${OUT:-results/mechanism}
rounds=${ROUNDS:-5}
n=${N:-200}
mkdir -p "$out"
rows=$out/rows.csv
commit=$(git rev-parse --short=12 HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || commit="$commit-dirty"
started=$(date -u '+%Y-%m-%d %H:%M UTC')
load0=$(cut -d' ' -f1-3 /proc/loadavg)
t0=$(date +%s)
sum=$(mktemp)
trap 'rm -f "$sum"' EXIT
echo "round,workload,config,cap_mib,seconds,per_s,status,processes,entered_images,armed" >"$rows"
for r in $(seq "$rounds"); do
	runs=()
	for w in fork exec; do
		runs+=("$w native -")
		for cap in 32 512; do
			runs+=("$w shim $cap" "$w inject $cap")
			[ -z "${BEFORE:-}" ] || runs+=("$w before $cap")
		done
	done
	mapfile -t order < <(printf '%s\n' "${runs[@]}" | shuf)
	for run in "${order[@]}"; do
		read -r w cfg cap <<<"$run"
		case $cfg in
		native) cmd=(bin/forkexec 64 "$n" "$w") ;;
		shim) cmd=(bin/farmem run --quiet --summary-json "$sum" --local-mem "${cap}MiB" -- bin/forkexec 64 "$n" "$w") ;;
		inject) cmd=(bin/farmem run --quiet --inject --summary-json "$sum" --local-mem "${cap}MiB" -- bin/forkexec 64 "$n" "$w") ;;
		before) cmd=("$BEFORE" run --quiet --summary-json "$sum" --local-mem "${cap}MiB" -- bin/forkexec 64 "$n" "$w") ;;
		esac
		: >"$sum"
		status=ok
		line=$("${cmd[@]}" 2>&1 | grep '^forkexec:' | tail -1) || status=failed
		case $line in *", OK") ;; *) status=failed ;; esac
		secs=$(sed -n 's/.* in \([0-9.]*\) s: \([0-9.]*\) per s.*/\1/p' <<<"$line")
		rate=$(sed -n 's/.* in \([0-9.]*\) s: \([0-9.]*\) per s.*/\2/p' <<<"$line")
		procs=- entered=- armed=-
		if [ "$cfg" != native ] && [ -s "$sum" ]; then
			procs=$(jq -r .processes "$sum") entered=$(jq -r .entered_images "$sum") armed=$(jq -r .armed "$sum")
		fi
		[ "$status" = ok ] || secs= rate=
		echo "$r,$w,$cfg,$cap,$secs,$rate,$status,$procs,$entered,$armed" >>"$rows"
		echo "round $r: $w $cfg $cap: ${rate:-failed} per s" >&2
	done
done
took=$(($(date +%s) - t0))
load1=$(cut -d' ' -f1-3 /proc/loadavg)
before=
[ -z "${BEFORE:-}" ] || before="$BEFORE: $("$BEFORE" version | sed -n 's/.*commit \([0-9a-f]*\).*/\1/p')"
python3 - "$rows" "$out/README.md" "$commit" "$started" "$took" "$load0" "$load1" "$rounds" "$n" "$before" <<'PY'
import csv, statistics, sys
rows_path, md, commit, started, took, load0, load1, rounds, n, before = sys.argv[1:]
rows = list(csv.DictReader(open(rows_path)))
def cell(w, cfg, cap):
    rs = [r for r in rows if r["workload"] == w and r["config"] == cfg and r["cap_mib"] == cap]
    ok = [float(r["per_s"]) for r in rs if r["status"] == "ok"]
    return (statistics.median(ok) if ok else None), len(rs) - len(ok), len(rs)
o = []
p = o.append
p("# The preloaded shim against injection, on a program that makes processes\n")
env = f"ROUNDS={rounds} N={n}" + (f" BEFORE={before.split(':')[0]}" if before else "")
p(f"Command: `{env} workloads/forkexec/mechanism.sh` (from the repository root, as root), started {started}, took {took} s. farmem {commit}" + (f"; *before*: {before}, with the shim, in the same rounds." if before else "."))
p(f"Load average at the start: {load0}; at the end: {load1} (2 cores).\n")
p(f"bin/forkexec holds 64 MiB and makes {n} processes, one at a time: *fork*: each child checks 16 random pages of its copy and exits; *exec*: each child execs /bin/true. The parent rewrites 16 pages after each, and checks every page at the end; a run whose check failed counts as failed and has no rate. *shim*: `farmem run` (the preloaded shim, the default for a dynamic program); *inject*: `farmem run --inject` (the program entered through ptrace, as a static one is: its forks served by farmem's fork server, each image a child execs entered by farmem, if it lives long enough to be seen). At 32 MiB the run pages; at 512 MiB it never arms. Medians of the runs that finished, over {rounds} interleaved rounds; raw rows: [rows.csv](rows.csv).\n")
bh = " before per s | shim / before |" if before else ""
p("| workload | cap MiB | native per s | shim per s | inject per s |" + bh + " inject / shim | shim / native | inject / native | failed (native / shim / inject" + (" / before" if before else "") + ") |")
p("|---|---|---|---|---|" + ("---|---|" if before else "") + "---|---|---|---|")
for w in ("fork", "exec"):
    nat, nf, _ = cell(w, "native", "-")
    for cap in ("32", "512"):
        sh, sf, _ = cell(w, "shim", cap)
        inj, jf, _ = cell(w, "inject", cap)
        f = lambda x: "-" if x is None else f"{x:.1f}"
        r = lambda a, b: "-" if a is None or b is None else f"{a / b:.2f}"
        bc, bf = "", ""
        if before:
            bv, bfail, _ = cell(w, "before", cap)
            bc, bf = f" {f(bv)} | {r(sh, bv)} |", f" / {bfail}"
        p(f"| {w} | {cap} | {f(nat)} | {f(sh)} | {f(inj)} |{bc} {r(inj, sh)} | {r(sh, nat)} | {r(inj, nat)} | {nf} / {sf} / {jf}{bf} |")
p("")
procs = {}
for r in rows:
    if r["config"] != "native" and r["status"] == "ok":
        procs.setdefault((r["workload"], r["config"], r["cap_mib"]), []).append((r["processes"], r["entered_images"]))
p("Processes farmem served and images it entered, per run (from `--summary-json`): " + "; ".join(
    f"{w} {c} {cap} MiB: {sorted(set(v))[0][0]}-{sorted(set(v))[-1][0]} processes, {sorted(set(x[1] for x in v))[0]}-{sorted(set(x[1] for x in v))[-1]} entered"
    for (w, c, cap), v in sorted(procs.items())) + ".")
open(md, "w").write("\n".join(o) + "\n")
PY
echo "wrote $out/README.md and $rows" >&2
