#!/usr/bin/env bash
# farmem's victim choice against LRU and Belady's MIN, on the same access stream at the same
# cap. For each workload:
#   1. natively: its footprint (peak RSS, VmHWM) and its verdict (micro: OK; pagerank: the
#      checksum);
#   2. its page-granular access stream, from a build of the same source with gcc's
#      ThreadSanitizer instrumentation whose callbacks workloads/replay/pagetrace.c records (the
#      verdict must equal the native one); its anonymous memory at exit;
#   3. live: farmem run --prefetch none at 50 % and 25 % of the footprint (at least farmem's
#      16 MiB), the re-faults from --summary-json (faults.backend.count), its fault trace recorded
#      beside (--record-faults) for its size;
#   4. offline: farmem sim --cap-pages on the stream at the same caps: MIN, LRU, CLOCK on
#      accessed bits and on written bits only, and farmem's own page table (--evict-heat 7, and
#      FIFO) replayed with the evictor's watermarks. The pages the
#      program holds outside the stream (stack, libc's data: RssAnon less the stream's pages)
#      are taken off each cap for the replays (--anon-pages).
# Writes results/replay.md and results/replay.csv (one row per workload and cap).
#
# Usage: workloads/replay/replay.sh   (make bench-replay; as root: farmem run needs userfaultfd)
# Env:   WORKLOADS  a subset of: micro-random micro-seq micro-zipf pagerank (default all)
#        CAPS       cap percentages (default "50 25")
#        OUT        the report (default results/replay.md; the CSV beside it, .csv)
#        WORK       scratch directory (default: a fresh mktemp -d, removed at exit unless KEEP=1)
set -euo pipefail
cd "$(dirname "$0")/../.."

workloads=${WORKLOADS:-micro-random micro-seq micro-zipf pagerank}
caps=${CAPS:-50 25}
out=${OUT:-results/replay.md}
csv=${out%.md}.csv
farmem=bin/farmem
minCap=$((16 << 20))

die() { echo "replay.sh: $*" >&2; exit 1; }
[ -x $farmem ] || die "$farmem is missing: run make build first"
for t in jq gcc /usr/bin/time; do
  command -v $t >/dev/null || die "$t is missing: apt-get install ${t##*/}"
done

work=${WORK:-$(mktemp -d /tmp/farmem-replay.XXXXXX)}
mkdir -p "$work" "$(dirname "$out")"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT

# The instrumented builds: every load and store the compiled code makes calls pagetrace.c.
traced() { # SRC NAME
  gcc -O2 -fsanitize=thread --param tsan-instrument-func-entry-exit=0 -c -o "$work/$2.o" "$1"
  gcc -O2 -o "$work/$2.traced" "$work/$2.o" workloads/replay/pagetrace.c -lm
}
traced workloads/micro/micro.c micro
traced workloads/graph/pagerank.c pagerank

args_of() {
  case $1 in
    micro-random) echo "--mib 64 --passes 2 --pattern random" ;;
    micro-seq) echo "--mib 64 --passes 2 --pattern seq" ;;
    micro-zipf) echo "--mib 64 --passes 2 --pattern zipf" ;;
    pagerank) echo "--mib 64 --iters 3" ;;
    *) die "unknown workload $1 (WORKLOADS: micro-random micro-seq micro-zipf pagerank)" ;;
  esac
}
# verdict LOG: the line that says the run was right, the same in every run of a workload.
verdict() { grep -E '^(micro: OK bad=0|pagerank: OK checksum=[0-9a-f]+ )' "$1" | sed 's/^\(pagerank: OK checksum=[0-9a-f]*\).*/\1/'; }

commit=$(git rev-parse --short=12 HEAD)
changed=$(git status --porcelain --untracked-files=no | awk '{print $2}' | tr '\n' ' ')
echo "commit,workload,args,footprint_kib,cap_pct,cap_pages,held_pages,stream_accesses,stream_pages,fault_trace_records,live_secs,live_refaults,min_refaults,lru_refaults,clock_refaults,clock_written_refaults,table_refaults,table_whole_cap_refaults,table_fifo_refaults,live_x_lru,live_x_min,table_x_lru,table_whole_cap_x_lru,lru_x_min" >"$csv.tmp"
for wl in $workloads; do
  args=$(args_of "$wl")
  prog=${wl%%-*}
  # 1. natively
  /usr/bin/time -f '%M' -o "$work/$wl.native.rss" bin/$prog $args >"$work/$wl.native.log"
  want=$(verdict "$work/$wl.native.log")
  [ -n "$want" ] || die "$wl: the native run has no OK line ($work/$wl.native.log)"
  foot=$(tail -1 "$work/$wl.native.rss")
  # 2. the access stream
  PAGETRACE="$work/$wl.pages" "$work/$prog.traced" $args >"$work/$wl.traced.log" 2>"$work/$wl.traced.err"
  [ "$(verdict "$work/$wl.traced.log")" = "$want" ] || die "$wl: the instrumented run's verdict differs from the native one ($work/$wl.traced.log)"
  line=$(grep '^pagetrace: ' "$work/$wl.traced.err") || die "$wl: no pagetrace line ($work/$wl.traced.err)"
  anon=$(sed -E 's/.* rss_anon_kib=([0-9]+) own_kib=([0-9]+)/\1 - \2/' <<<"$line")
  anon_pages=$(( ($anon) / 4 ))
  capl=()
  for pct in $caps; do
    c=$(( foot * 1024 * pct / 100 / 4096 * 4096 ))
    [ $c -ge $minCap ] || c=$minCap
    capl+=($((c / 4096)))
  done
  # 4. offline, all caps in one read of the stream
  $farmem sim --trace "$work/$wl.pages" --cap-pages "$(IFS=,; echo "${capl[*]}")" --anon-pages $anon_pages --json >"$work/$wl.sim.json"
  accesses=$(jq .accesses "$work/$wl.sim.json")
  pages=$(jq .pages "$work/$wl.sim.json")
  rm -f "$work/$wl.pages"
  i=0
  for pct in $caps; do
    cp=${capl[$i]}
    i=$((i + 1))
    # 3. live
    log=$work/$wl.$pct
    s0=$(date +%s.%N)
    $farmem run --local-mem $((cp * 4096)) --prefetch none --quiet --summary-json "$log.json" --record-faults "$log.fmtrace" -- bin/$prog $args >"$log.out" 2>"$log.err" ||
      die "$wl at $pct %: farmem run failed ($log.err)"
    s1=$(date +%s.%N)
    [ "$(verdict "$log.out")" = "$want" ] || die "$wl at $pct %: the verdict differs from the native one ($log.out)"
    live=$(jq -r '.faults.backend.count' "$log.json")
    [ -n "$live" ] && [ "$live" != null ] || die "$wl at $pct %: no faults.backend.count in $log.json"
    records=$(( ($(stat -c %s "$log.fmtrace") - 8) / 24 ))
    rm -f "$log.fmtrace"
    q() { jq -r --argjson c "$cp" --arg p "$1" '.rows[] | select(.cap_pages == $c and .policy == $p) | .'"$2" "$work/$wl.sim.json"; }
    held=$(q min held_pages)
    mn=$(q min refaults) lru=$(q lru refaults) ck=$(q clock refaults) cw=$(q clock-w refaults) tb=$(q farmem refaults) t0=$(q farmem-0 refaults) ff=$(q fifo refaults)
    r() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print ""; else printf "%.2f", a / b }'; }
    echo "$commit,$wl,$args,$foot,$pct,$cp,$held,$accesses,$pages,$records,$(awk -v a="$s0" -v b="$s1" 'BEGIN { printf "%.2f", b - a }'),$live,$mn,$lru,$ck,$cw,$tb,$t0,$ff,$(r "$live" "$lru"),$(r "$live" "$mn"),$(r "$tb" "$lru"),$(r "$t0" "$lru"),$(r "$lru" "$mn")" >>"$csv.tmp"
    echo "replay.sh: $wl $pct %: live $live re-faults, replayed: table $tb, LRU $lru, MIN $mn" >&2
  done
done
mv "$csv.tmp" "$csv"

{
  echo "# farmem's victim choice against LRU and Belady's MIN"
  echo
  echo "\`make bench-replay\` (workloads/replay/replay.sh) at farmem $commit${changed:+ with uncommitted changes in $changed}; one run each; raw rows: [$(basename "$csv")]($(basename "$csv"))."
  echo
  echo "| workload | cap | cap pages (held in replay) | live re-faults | farmem's table, replayed (whole cap; FIFO) | LRU | MIN | CLOCK, accessed bits | CLOCK, written bits | live / LRU | live / MIN | table / LRU (whole cap) | LRU / MIN | live faults recorded |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  tail -n +2 "$csv" | while IFS=, read -r _ wl _ _ pct cp held _ _ rec _ live mn lru ck cw tb t0 ff xl xm tl t0l lm; do
    echo "| $wl | $pct % | $cp ($held) | $live | $tb ($t0; $ff) | $lru | $mn | $ck | $cw | $xl | $xm | $tl ($t0l) | $lm | $rec |"
  done
  echo
  echo "Per workload, the access stream (accesses after folding repeats of a page at once; its distinct pages), against which a live fault trace (the last column above) is a small sample:"
  echo
  tail -n +2 "$csv" | awk -F, '!seen[$2]++ { printf "- %s (`%s`): footprint %d KiB, %d accesses to %d pages\n", $2, $3, $4, $8, $9 }'
  echo
  cat workloads/replay/notes.md
} >"$out"
echo "replay.sh: wrote $out and $csv" >&2
