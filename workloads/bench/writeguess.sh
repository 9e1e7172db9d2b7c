#!/bin/bash
# writeguess.sh: farmem's write guess, --write-guess auto against last, side by side.
#
# Runs xz -6 of generated text (its match finder writes most pages it reads back) and the JVM's
# HeapGraph under G1 (some of its pages read back are only read) under farmem at a fixed cap,
# ROUNDS rounds (default 3), the two settings alternating within each round, every output
# checked against the native run's. Writes OUT/runs.csv (a row per run: wall, user and system
# CPU of the whole run, and from --summary-json the faults by kind, the WP faults' service time,
# the pages written out and dropped clean, the evictor's store stage) and OUT/writeguess.md
# (medians). As root, from the repository root, after make build.
#
#   ROUNDS=3 OUT=results/writeguess workloads/bench/writeguess.sh
set -euo pipefail
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-results/writeguess}
FARMEM=${FARMEM:-bin/farmem}
[ -x "$FARMEM" ] || { echo "writeguess.sh: $FARMEM missing: run make build" >&2; exit 1; }
command -v xz >/dev/null && command -v java >/dev/null && command -v javac >/dev/null ||
  { echo "writeguess.sh: needs xz and OpenJDK (scripts/test-deps.sh installs them)" >&2; exit 1; }
mkdir -p "$OUT"
work=$(mktemp -d /tmp/writeguess.XXXXXX)
trap 'rm -rf "$work"' EXIT

# 3 MB of base64 text from a fixed seed: the same input in every run and on every machine.
python3 -c 'import random,base64,sys; r=random.Random(1); sys.stdout.write(base64.encodebytes(bytes(r.getrandbits(8) for _ in range(2250000))).decode())' >"$work/in.txt"
mkdir -p "$work/jvm"
javac --release 17 -d "$work/jvm" workloads/jvm/HeapGraph.java
JAVA=(java -Xms100m -Xmx100m -XX:+UseG1GC -XX:ParallelGCThreads=2 -XX:ConcGCThreads=1 -XX:-UseTransparentHugePages
  -XX:-UseContainerSupport -XX:-UsePerfData -cp "$work/jvm" HeapGraph --entries 250000 --passes 2)

# name cap command...: the workloads. xz's output goes to a file; HeapGraph prints its checksum.
run_native() {
  case $1 in
    xz) xz -6 -c "$work/in.txt" >"$work/native.xz" ;;
    jvm) "${JAVA[@]}" | grep -o 'checksum=[0-9a-f]*' >"$work/native.jvm" ;;
  esac
}
run_farmem() { # workload setting
  local sum=$work/summary.json
  case $1 in
    xz) /usr/bin/time -f '%e %U %S' -o "$work/time" "$FARMEM" run --quiet --local-mem 24MiB --write-guess "$2" --summary-json "$sum" -- \
          xz -6 -c "$work/in.txt" >"$work/out.xz"
        cmp -s "$work/out.xz" "$work/native.xz" || { echo "writeguess.sh: xz output differs from native ($2)" >&2; exit 1; } ;;
    jvm) /usr/bin/time -f '%e %U %S' -o "$work/time" "$FARMEM" run --quiet --local-mem 74MiB --write-guess "$2" --summary-json "$sum" -- \
          "${JAVA[@]}" | grep -o 'checksum=[0-9a-f]*' >"$work/out.jvm"
        cmp -s "$work/out.jvm" "$work/native.jvm" || { echo "writeguess.sh: HeapGraph checksum differs from native ($2)" >&2; exit 1; } ;;
  esac
  python3 - "$1" "$2" "$3" "$work/time" "$sum" >>"$OUT/runs.csv" <<'PY'
import json, sys
wl, setting, rnd, tfile, sfile = sys.argv[1:]
wall, user, sys_ = open(tfile).read().split()[-3:]
d = json.load(open(sfile))
f, ev, st, b = d["faults"], d["evicted"], d["batches"]["stage_ns"], d["batches"]
print(",".join(str(x) for x in [wl, setting, rnd, wall, user, sys_, f["backend"]["count"], f["wp"]["count"], f["wp"]["sum_ns"],
    ev["written"], ev["dropped_clean"], b["staged"], st.get("store", 0), st.get("copy out", 0)]))
PY
}

echo "workload,setting,round,wall_s,user_s,sys_s,backend_faults,wp_faults,wp_sum_ns,written,dropped_clean,batch_pages,store_ns,copy_out_ns" >"$OUT/runs.csv"
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for wl in xz jvm; do run_native $wl; done
for r in $(seq 1 "$ROUNDS"); do
  for wl in xz jvm; do
    # Alternate which setting goes first, so that drift hits both alike.
    if [ $((r % 2)) = 1 ]; then order="last auto"; else order="auto last"; fi
    for s in $order; do
      echo "writeguess.sh: round $r $wl --write-guess $s" >&2
      run_farmem $wl $s $r
    done
  done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$OUT" "$commit" "$started" "$ROUNDS" "$load0" "$load1" <<'PY'
import csv, statistics, sys
out, commit, started, rounds, load0, load1 = sys.argv[1:]
rows = list(csv.DictReader(open(out + "/runs.csv")))
med = lambda wl, s, k: statistics.median(float(r[k]) for r in rows if r["workload"] == wl and r["setting"] == s)
n = lambda wl, s: sum(1 for r in rows if r["workload"] == wl and r["setting"] == s)
L = []
p = L.append
p("# The write guess: --write-guess auto against last\n")
p(f"`ROUNDS={rounds} OUT={out} workloads/bench/writeguess.sh` at farmem {commit}, started {started}; load average {load0} at the start, {load1} at the end. Raw rows: [runs.csv](runs.csv). Medians of {rounds} rounds, the two settings alternating within each round (which goes first alternates too); every output equal to the native run's.\n")
p("- **xz**: `xz -6` of 3 MB of base64 text from a fixed seed, under `farmem run --local-mem 24MiB` (about half its native peak).")
p("- **jvm**: OpenJDK 17, G1, `HeapGraph --entries 250000 --passes 2` with a 100 MiB heap, under `--local-mem 74MiB` (about half).")
p("- **last**: a page read back on a read is installed writable only if its last stay wrote it; **auto** (the default): also while at least 30 % of the process's stays of pages read back wrote them (until that falls below 20 %), counted over windows of 1,024 stays.\n")
p("| workload | setting | runs | wall s | user s | sys s | backend faults | WP faults | WP fault service µs (mean) | pages written out | dropped clean | store µs/page | copy out µs/page |")
p("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for wl in ("xz", "jvm"):
    for s in ("last", "auto"):
        wp = med(wl, s, "wp_faults")
        wpmean = statistics.median(float(r["wp_sum_ns"]) / float(r["wp_faults"]) / 1e3 for r in rows if r["workload"] == wl and r["setting"] == s and float(r["wp_faults"]) > 0) if any(float(r["wp_faults"]) > 0 for r in rows if r["workload"] == wl and r["setting"] == s) else float("nan")
        store = statistics.median(float(r["store_ns"]) / float(r["batch_pages"]) / 1e3 for r in rows if r["workload"] == wl and r["setting"] == s)
        copy = statistics.median(float(r["copy_out_ns"]) / float(r["batch_pages"]) / 1e3 for r in rows if r["workload"] == wl and r["setting"] == s)
        p(f"| {wl} | {s} | {n(wl, s)} | {med(wl, s, 'wall_s'):.2f} | {med(wl, s, 'user_s'):.2f} | {med(wl, s, 'sys_s'):.2f} | {med(wl, s, 'backend_faults'):.0f} | {wp:.0f} | {wpmean:.1f} | {med(wl, s, 'written'):.0f} | {med(wl, s, 'dropped_clean'):.0f} | {store:.2f} | {copy:.2f} |")
p("\n| workload | auto / last: wall | user + sys CPU | WP faults |")
p("|---|---|---|---|")
for wl in ("xz", "jvm"):
    cpu = lambda s: med(wl, s, "user_s") + med(wl, s, "sys_s")
    p(f"| {wl} | {med(wl, 'auto', 'wall_s') / med(wl, 'last', 'wall_s'):.2f} | {cpu('auto') / cpu('last'):.2f} | {med(wl, 'auto', 'wp_faults'):.0f} / {med(wl, 'last', 'wp_faults'):.0f} |")
p("\nCPU is the whole run's (farmem's and the program's), from `/usr/bin/time`. *store* and *copy out* are the evictor's stage times over the pages its batches took (`--summary-json`'s `batches.stage_ns` over `batches.staged`): what a wrong guess costs beyond a clean drop is a copy out and a store; what a missed one costs is a WP fault.")
open(out + "/writeguess.md", "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
