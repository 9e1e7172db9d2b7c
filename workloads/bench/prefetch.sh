#!/usr/bin/env bash
# The prefetcher benchmark (issue 4): for each workload,
#   1. its footprint, measured once natively (peak RSS, VmHWM), with its native time;
#   2. a fault trace recorded at 25 % of the footprint with --prefetch none, replayed through every
#      prefetcher by `farmem sim --prefetcher all --json`: misses, pollution, accuracy, coverage,
#      lead (the timeliness proxy);
#   3. end to end: the live workload at 50 % and 25 % caps with --prefetch none, leap, readahead,
#      stride and nextn (and leap in both --prefetch-modes, map and cache, when farmem run has the
#      flag), ROUNDS times interleaved; the medians of wall time and backend faults, and the time
#      relative to none at the same cap.
# Every run checks the workload's own verdict (micro: OK bad=0; pagerank: the checksum of the
# native run; redisdrive: OK, every value read checked) and stops the benchmark if it fails.
#
# Usage: workloads/bench/prefetch.sh   (make bench-prefetch; make bench-smoke runs a short one)
# Env:   SCALE      multiplies the workload sizes (default 1: micro 96 MiB, redis 80k keys of
#                   1000 B and 80k ops, pagerank 64 MiB); caps below farmem's 16 MiB are raised to it
#        ROUNDS     end-to-end rounds, the median is reported (default 3)
#        WORKLOADS  a subset of: seq stride strides random redis pagerank (default all)
#        CAPS       cap percentages for the end-to-end runs (default "50 25")
#        CONFIGS    the prefetch configurations, NAME[:MODE][/MAX] each (default: none, leap in
#                   map and cache mode, readahead, stride, nextn, at farmem run's --prefetch-max)
#        OUT        the report (default results/prefetch.md); logs and traces go to WORK
#        WORK       scratch directory (default: a fresh mktemp -d, removed at exit unless KEEP=1)
#        TIMEOUT    seconds a run may take (default 30 times the native run, at least 120)
# Exit status: 1 if a workload failed its own check or farmem failed (at once), 3 if a run hung
# (it is stopped at its limit, the benchmark goes on and the report lists it).
set -euo pipefail
cd "$(dirname "$0")/../.."

scale=${SCALE:-1}
rounds=${ROUNDS:-3}
workloads=${WORKLOADS:-seq stride strides random redis pagerank}
caps=${CAPS:-50 25}
out=${OUT:-results/prefetch.md}
farmem=bin/farmem

die() { echo "prefetch.sh: $*" >&2; exit 1; }
for b in $farmem bin/micro bin/pagerank bin/redisdrive; do
  [ -x $b ] || die "$b is missing: run make build first"
done
for t in jq bc /usr/bin/time; do
  command -v $t >/dev/null || die "$t is missing: apt-get install ${t##*/}"
done
case " $workloads " in *" redis "*)
  for t in redis-server redis-cli; do
    command -v $t >/dev/null || die "$t is missing: apt-get install redis-server (or leave redis out of WORKLOADS)"
  done ;;
esac
for w in $workloads; do
  case $w in seq | stride | strides | random | redis | pagerank) ;; *) die "unknown workload $w (WORKLOADS: seq stride strides random redis pagerank)" ;; esac
done

# The workload sizes: SCALE times the defaults, chosen so that the whole benchmark (216 end-to-end
# runs) takes under 20 minutes on 2 idle cores: at micro 128 MiB, redis 100k keys and pagerank
# 96 MiB (whose vertex arrays no longer fit its 25 % cap) it was on course for 30.
scaled() { awk -v v="$1" -v s="$scale" -v lo="$2" 'BEGIN { x = int(v * s + 0.5); print (x < lo) ? lo : x }'; }
micro_mib=$(scaled 96 8)
micro_passes=2
redis_keys=$(scaled 80000 1000)
redis_ops=$(scaled 80000 1000)
pagerank_mib=$(scaled 64 8)

# Prefetch configurations: NAME or NAME:MODE. Leap in both modes when farmem run has them.
configs="none leap readahead stride nextn"
has_modes=0
help=$($farmem run --help 2>&1 | tr -s ' \n' ' ' || true) # (grep -q in a pipe would SIGPIPE farmem: pipefail)
case "$help" in
  *--prefetch-mode*)
    mode_help=${help#*--prefetch-mode} # the flag's own usage text: up to the next flag
    mode_help=${mode_help%% --*}
    case "$mode_help" in *map*cache* | *cache*map*) has_modes=1; configs="none leap:map leap:cache readahead stride nextn" ;; esac ;;
esac
configs=${CONFIGS:-$configs}

declare -A ref_sum   # pagerank: the native run's checksum
declare -A footprint # MiB
declare -A native_s  # the native run's wall time

work=${WORK:-$(mktemp -d /tmp/farmem-bench-prefetch.XXXXXX)}
mkdir -p "$work" "$(dirname "$out")"
hung=0
bg= # the background process this script started and has not reaped: redis-server, or farmem running it
# stop_bg: TERM it and its children (redis-server under farmem), KILL it after 10 s; reap it.
stop_bg() {
  [ -n "$bg" ] || return 0
  if kill -0 "$bg" 2>/dev/null; then
    for c in $(pgrep -P "$bg" || true); do kill "$c" 2>/dev/null || true; done
    kill "$bg" 2>/dev/null || true
    for _ in $(seq 100); do
      kill -0 "$bg" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$bg" 2>/dev/null || true
  fi
  wait "$bg" 2>/dev/null || true
  bg=
}
cleanup() {
  local st=$?
  stop_bg
  if [ "${KEEP:-0}" = 1 ] || [ $st != 0 ]; then
    echo "prefetch.sh: logs and traces kept in $work" >&2
  elif [ -z "${WORK:-}" ]; then
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

now() { date +%s.%N; }
elapsed() { echo "$(now) - $1" | bc; }

# warm WL touches guest memory before a run: first touch of cold guest memory costs ~10 us/page
# here, which would bill whichever run came first (as in redis.sh). Three times the footprint
# (the program, farmem's store, slack), 64 MiB to 1 GiB.
warm() {
  local f=${footprint[$1]:-341}
  dd if=/dev/zero of=/dev/null bs=1M count=$((f * 3 < 64 ? 64 : f * 3 > 1024 ? 1024 : f * 3)) 2>/dev/null || true
}

# fail LOG MESSAGE: a workload's verdict was wrong or it failed.
fail() {
  echo "prefetch.sh: FAILED: $2" >&2
  echo "---- last lines of $1:" >&2
  tail -20 "$1" >&2 || true
  exit 1
}

# free_port: a port on 127.0.0.1 nothing listens on.
free_port() {
  local p
  for p in $(seq $((6500 + $$ % 400)) 7000); do
    if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo $p; return; fi
  done
  die "no free port for redis-server"
}

wl_title() {
  case $1 in
    seq) echo "micro seq" ;;
    stride) echo "micro stride:10" ;;
    strides) echo "micro strides:3,7" ;;
    random) echo "micro random" ;;
    redis) echo "redis-server + redisdrive" ;;
    pagerank) echo "pagerank" ;;
  esac
}
wl_args() { # the workload's command line (micro, pagerank)
  case $1 in
    seq) echo "bin/micro --mib $micro_mib --passes $micro_passes --pattern seq" ;;
    stride) echo "bin/micro --mib $micro_mib --passes $micro_passes --pattern stride:10" ;;
    strides) echo "bin/micro --mib $micro_mib --passes $micro_passes --pattern strides:3,7" ;;
    random) echo "bin/micro --mib $micro_mib --passes $micro_passes --pattern random" ;;
    pagerank) echo "bin/pagerank --mib $pagerank_mib" ;;
  esac
}
redis_server_args() { echo "redis-server --port $1 --bind 127.0.0.1 --save \"\" --appendonly no"; }
redisdrive_args() { echo "bin/redisdrive --addr 127.0.0.1:$1 --keys $redis_keys --ops $redis_ops"; }

# check WL LOG: the workload's own verdict in LOG.
check() {
  case $1 in
    seq | stride | strides | random) grep -q '^micro: OK bad=0$' "$2" || fail "$2" "$1: micro did not report OK" ;;
    pagerank)
      grep -q "^pagerank: OK checksum=${ref_sum[pagerank]} " "$2" ||
        fail "$2" "pagerank: no OK line with the native run's checksum ${ref_sum[pagerank]}" ;;
    redis) grep -q '^redisdrive: OK ' "$2" || fail "$2" "redis: redisdrive did not report OK" ;;
  esac
}

# limit WL: how long one run may take before it counts as hung: 30 times the native run, at
# least 2 minutes (TIMEOUT overrides; 10 minutes before the native run).
limit() {
  if [ -n "${TIMEOUT:-}" ]; then echo "$TIMEOUT"; return; fi
  awk -v n="${native_s[$1]:-20}" 'BEGIN { t = int(30 * n + 1); print (t < 120) ? 120 : t }'
}

# run_redis WL LOG PREFIX...: redis-server under PREFIX (none: natively), driven once by
# redisdrive; sets secs to the driver's wall time, hung (1 if the driver or the server's exit
# took longer than limit) and, natively, hwm to redis-server's VmHWM in MiB.
run_redis() {
  local wl=$1 log=$2; shift 2
  local port; port=$(free_port)
  "$@" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >"$log" 2>&1 &
  bg=$!
  local up=0
  for _ in $(seq 200); do
    if timeout 5 redis-cli -p "$port" ping >/dev/null 2>&1; then up=1; break; fi
    kill -0 $bg 2>/dev/null || break
    sleep 0.05
  done
  [ $up = 1 ] || fail "$log" "redis-server (under '$*') did not start"
  local t0 st=0; t0=$(now)
  # shellcheck disable=SC2046 # the argument string is words on purpose
  timeout -k 10 "$(limit "$wl")" $(redisdrive_args "$port") >"$log.drive" 2>&1 || st=$?
  secs=$(elapsed "$t0")
  hung=0
  hwm=-
  if [ $st = 124 ] || [ $st = 137 ]; then
    hung=1
    timeout 10 redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    stop_bg
    cat "$log.drive" >>"$log"
    return
  fi
  if [ $# = 0 ]; then hwm=$(awk '/^VmHWM:/ {print int($2 / 1024 + 0.5)}' /proc/$bg/status); fi
  timeout 30 redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  for _ in $(seq 300); do
    kill -0 $bg 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 $bg 2>/dev/null; then # the server (or farmem) did not exit
    hung=1
    stop_bg
    cat "$log.drive" >>"$log"
    return
  fi
  local rst=0
  wait $bg || rst=$?
  bg=
  cat "$log.drive" >>"$log"
  [ $st = 0 ] || fail "$log" "redisdrive exited with status $st"
  [ $rst = 0 ] || fail "$log" "redis-server (under '$*') exited with status $rst"
  check redis "$log"
}

# run_wl WL LOG PREFIX...: one run of the workload under PREFIX (none: natively); checks its
# verdict and sets secs to its wall time (redis: the driver's) and hung to 1 if it took longer
# than limit (it is stopped then, and its verdict not checked).
run_wl() {
  local wl=$1 log=$2; shift 2
  if [ "$wl" = redis ]; then
    run_redis "$wl" "$log" "$@"
    return
  fi
  local t0 st=0; t0=$(now)
  # shellcheck disable=SC2046
  timeout -k 10 "$(limit "$wl")" "$@" $(wl_args "$wl") >"$log" 2>&1 || st=$?
  secs=$(elapsed "$t0")
  hung=0
  if [ $st = 124 ] || [ $st = 137 ]; then hung=1; return; fi
  [ $st = 0 ] || fail "$log" "$wl under '$*' exited with status $st"
  check "$wl" "$log"
}

# cap_mib WL PCT: PCT % of the footprint, at least farmem's 16 MiB.
cap_mib() { awk -v f="${footprint[$1]}" -v p="$2" 'BEGIN { c = int(f * p / 100 + 0.5); print (c < 16) ? 16 : c }'; }

# prefetch_flags CONFIG: farmem run's flags for NAME or NAME:MODE.
# A configuration is NAME[:MODE][/MAX]: leap, leap:cache, leap:map/32.
prefetch_flags() {
  local c=${1%%/*} f=
  case $1 in */*) f=" --prefetch-max ${1#*/}" ;; esac
  case $c in
    *:*) echo "--prefetch ${c%%:*} --prefetch-mode ${c#*:}$f" ;;
    *) echo "--prefetch $c$f" ;;
  esac
}
config_label() {
  local c=${1%%/*} m=
  case $1 in */*) m="max ${1#*/}" ;; esac
  case $c in
    *:*) echo "${c%%:*} (${c#*:}${m:+, $m})" ;;
    *) echo "$c${m:+ ($m)}" ;;
  esac
}

busy() { pgrep -f '\.ci/run|go test' >/dev/null && echo "busy (a test suite was running: $(pgrep -fa '\.ci/run|go test' | head -2 | cut -c1-60 | tr '\n' ';'))" || echo "idle"; }
busy_start=$(busy)
start=$(now)
started=$(date -u '+%Y-%m-%d %H:%M UTC')

# 1. Footprints and native references.
for wl in $workloads; do
  log=$work/$wl-native.log
  warm "$wl"
  if [ "$wl" = redis ]; then
    run_redis "$wl" "$log"
    [ $hung = 0 ] || fail "$log" "redis hung natively (limit $(limit "$wl") s)"
    native_s[$wl]=$secs
    footprint[$wl]=$hwm
  else
    t0=$(now)
    # shellcheck disable=SC2046
    timeout -k 10 "$(limit "$wl")" /usr/bin/time -f 'maxrss_kb %M' -o "$log.time" $(wl_args "$wl") >"$log" 2>&1 ||
      fail "$log" "$wl failed natively (or took longer than $(limit "$wl") s)"
    native_s[$wl]=$(elapsed "$t0")
    footprint[$wl]=$(awk '/^maxrss_kb/ {print int($2 / 1024 + 0.5)}' "$log.time")
    if [ "$wl" = pagerank ]; then
      ref_sum[pagerank]=$(sed -n 's/^pagerank: OK checksum=\([0-9a-f]*\) .*/\1/p' "$log")
      [ -n "${ref_sum[pagerank]}" ] || fail "$log" "pagerank did not report OK natively"
    fi
    check "$wl" "$log"
  fi
  echo "prefetch.sh: $wl: footprint ${footprint[$wl]} MiB, native $(printf %.2f "${native_s[$wl]}") s" >&2
done

# 2. Traces at 25 %, replayed through every prefetcher.
for wl in $workloads; do
  cap=$(cap_mib "$wl" 25)
  trace=$work/$wl.fmtrace
  warm "$wl"
  run_wl "$wl" "$work/$wl-trace.log" $farmem run --quiet --prefetch none --record-faults "$trace" --local-mem "${cap}MiB" --
  [ $hung = 0 ] || fail "$work/$wl-trace.log" "$wl hung while its trace was recorded (limit $(limit "$wl") s)"
  $farmem sim --trace "$trace" --prefetcher all --json >"$work/$wl-sim.json" || die "farmem sim failed on $trace"
  echo "prefetch.sh: $wl: trace at ${cap} MiB: $(jq .faults "$work/$wl-sim.json") faults replayed" >&2
done

# 3. End to end, rounds interleaved.
raw=$work/runs.txt
hungs=$work/hung.txt # runs stopped at their limit: left out of the medians
: >"$raw"
: >"$hungs"
ncfg=$(echo $configs | wc -w); ncap=$(echo $caps | wc -w); nwl=$(echo $workloads | wc -w)
total=$((rounds * ncfg * ncap * nwl)); i=0
for wl in $workloads; do
  for r in $(seq "$rounds"); do
    for pct in $caps; do
      cap=$(cap_mib "$wl" "$pct")
      for cfg in $configs; do
        i=$((i + 1))
        log=$work/$wl-$pct-${cfg//[:\/]/-}-$r.log
        warm "$wl"
        # shellcheck disable=SC2046
        run_wl "$wl" "$log" $farmem run $(prefetch_flags "$cfg") --local-mem "${cap}MiB" --summary-json "$log.json" --
        if [ $hung = 1 ]; then
          echo "$wl $pct $cfg $r $log" >>"$hungs"
          printf 'prefetch.sh: [%d/%d] %s %s%% %s round %d: HUNG, stopped after %.0f s (log: %s)\n' $i $total "$wl" "$pct" "$cfg" "$r" "$secs" "$log" >&2
          continue
        fi
        # farmem's numbers, raw, from its --summary-json (placed: installed in map mode, cached in
        # cache mode).
        backend=$(jq -r '.faults.backend.count' "$log.json" 2>/dev/null || true)
        [ -n "$backend" ] && [ "$backend" != null ] || fail "$log" "no farmem --summary-json ($log.json)"
        pf=$(jq -r 'if .prefetch then "\(.prefetch.issued) \(.prefetch.placed) \(.prefetch.used)" else "0 0 0" end' "$log.json")
        ops=-
        if [ "$wl" = redis ]; then ops=$(sed -n 's/^redisdrive: run .* ops_per_sec=\([0-9]*\)$/\1/p' "$log" | head -1); fi
        echo "$wl $pct $cfg $r $secs $backend $pf $ops" >>"$raw"
        printf 'prefetch.sh: [%d/%d] %s %s%% %s round %d: %.2f s, backend faults %s\n' $i $total "$wl" "$pct" "$cfg" "$r" "$secs" "$backend" >&2
      done
    done
  done
done
total_s=$(elapsed "$start")
busy_end=$(busy)

# median WL PCT CFG FIELD: the median over the rounds of one field of runs.txt.
median() {
  awk -v w="$1" -v p="$2" -v c="$3" -v f="$4" '$1 == w && $2 == p && $3 == c {print $f}' "$raw" | sort -g |
    awk '{v[NR] = $1} END {if (NR == 0) print "-"; else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

cmd="workloads/bench/prefetch.sh"
for v in TIMEOUT OUT CAPS WORKLOADS ROUNDS SCALE; do
  if [ -n "${!v:-}" ]; then cmd="$v=$(printf %q "${!v}") $cmd"; fi
done
changed=$(git status --porcelain -- . ':!results' 2>/dev/null | awk '{print $2}' | tr '\n' ' ')
{
  echo "# Prefetchers: fault traces and end to end"
  echo
  echo "Command: \`$cmd\`${MAKELEVEL:+ (from make)}, started $started, took $(printf %.0f "$total_s") s."
  echo "Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(awk '/MemTotal/ {print int($2 / 1048576 + 0.5)}' /proc/meminfo) GiB, Linux $(uname -r);"
  echo "farmem $(git rev-parse --short HEAD 2>/dev/null || echo '?')${changed:+ with uncommitted changes in $changed}; embedded backend, no compression."
  echo "The machine was $busy_start at the start and $busy_end at the end."
  echo
  echo "## Workloads"
  echo
  echo "Footprint: the native run's peak RSS (VmHWM; the caps are on anonymous memory, which is all"
  echo "but a few MiB of it). Caps are rounded to MiB and at least farmem's 16 MiB."
  echo
  echo "| workload | command | footprint MiB | cap 50 % | cap 25 % | native s |"
  echo "|---|---|---|---|---|---|"
  for wl in $workloads; do
    case $wl in
      redis) c="\`$(redis_server_args PORT)\` driven by \`$(redisdrive_args PORT)\` (1000 B values, zipfian 0.99, 90 % GET; populate, ops, then a GET of every key)" ;;
      pagerank) c="\`$(wl_args "$wl")\` (10 iterations; checksum ${ref_sum[pagerank]} checked on every run)" ;;
      *) c="\`$(wl_args "$wl")\`" ;;
    esac
    printf '| %s | %s | %s | %s | %s | %.2f |\n' "$(wl_title "$wl")" "$c" "${footprint[$wl]}" "$(cap_mib "$wl" 50)" "$(cap_mib "$wl" 25)" "${native_s[$wl]}"
  done
  echo
  echo "## Traces replayed (\`farmem sim --prefetcher all --json\`)"
  echo
  echo "Each trace was recorded with \`farmem run --prefetch none --record-faults\` at the 25 % cap."
  echo "Each prefetcher is scored in both modes. map is what \`farmem run\` does by default: predicted"
  echo "pages are installed (at most 32 a fault), a touch of one is an unseen hit, and the prefetcher"
  echo "is fed the hits inferred from where the next miss lands. cache is Leap's model: predicted pages"
  echo "go to a FIFO prefetch cache (at most 8 a fault), and a fault that finds its page there is a hit"
  echo "the prefetcher sees. Either way at most 4096 prefetched pages wait unused. Misses: faults still"
  echo "served from far memory (fewer is better); pollution: prefetched pages never used; accuracy ="
  echo "hits / prefetched; coverage = hits / faults; lead (timeliness): the process's faults between a"
  echo "page's prefetch and its use, median and mean, and the share of hits with lead 1 (fetched by"
  echo "the fault just before, which a live run may not have received in time). History 32."
  for wl in $workloads; do
    j=$work/$wl-sim.json
    echo
    echo "### $(wl_title "$wl"): $(jq .faults "$j") faults replayed ($(jq .skipped "$j") first-touch/write-protect skipped), $(jq .processes "$j") process(es)"
    echo
    echo "| prefetcher | mode | max | misses | hits | prefetched | pollution | accuracy | coverage | lead p50 | lead mean | lead=1 |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
    jq -r '.results[] | [.prefetcher, .mode, .prefetch_max, .misses, .hits, .prefetched, .pollution, .accuracy, .coverage, .lead_p50, .lead_mean, .lead_one] | @tsv' "$j" |
      awk -F'\t' '{printf "| %s | %s | %d | %d | %d | %d | %d | %.1f %% | %.1f %% | %d | %.1f | %s |\n", $1, $2, $3, $4, $5, $6, $7, 100 * $8, 100 * $9, $10, $11, ($5 > 0) ? sprintf("%.0f %%", 100 * $12 / $5) : "-"}'
    echo
    for m in map cache; do
      echo "Fewest misses in $m mode: $(jq -r --arg m "$m" '[.results[] | select(.mode == $m)] | min_by(.misses) | "\(.prefetcher) (\(.misses) of \(.faults))"' "$j")."
    done
  done
  echo
  echo "## End to end (medians of $rounds rounds, interleaved)"
  echo
  echo "Wall time: the whole run (redis: the driver's populate, ops and verify; redis-server's start"
  echo "and shutdown excluded). x none: the time over none's at the same cap (below 1 is faster)."
  echo "Backend faults: farmem's count (the misses). Installed: the live prefetcher's pages put into"
  echo "the program (map mode) or its prefetch cache (cache mode); used: the ones inferred used (map)"
  echo "or taken from the cache by a fault (cache), as farmem's summary counts them."
  if [ $has_modes = 1 ]; then echo "leap ran in both \`--prefetch-mode\`s: map (installed at once) and cache (held until their fault); the other prefetchers in the default (map)."; fi
  for wl in $workloads; do
    echo
    echo "### $(wl_title "$wl")"
    echo
    if [ "$wl" = redis ]; then
      echo "| cap | prefetch | wall s | x none | backend faults | installed | used | ops/s (zipfian phase) |"
      echo "|---|---|---|---|---|---|---|---|"
    else
      echo "| cap | prefetch | wall s | x none | backend faults | installed | used |"
      echo "|---|---|---|---|---|---|---|"
    fi
    for pct in $caps; do
      base=$(median "$wl" "$pct" none 5)
      for cfg in $configs; do
        s=$(median "$wl" "$pct" "$cfg" 5)
        label=$(config_label "$cfg")
        nh=$(awk -v w="$wl" -v p="$pct" -v c="$cfg" '$1 == w && $2 == p && $3 == c' "$hungs" | wc -l)
        if [ "$nh" -gt 0 ]; then label="$label (**$nh of $rounds hung**)"; fi
        if [ "$s" = - ]; then
          printf '| %s %% (%s MiB) | %s | - | - | - | - | - |%s\n' "$pct" "$(cap_mib "$wl" "$pct")" "$label" "$([ "$wl" = redis ] && echo " - |")"
          continue
        fi
        ratio=-
        if [ "$base" != - ]; then ratio=$(printf %.2f "$(echo "$s / $base" | bc -l)"); fi
        extra=""
        if [ "$wl" = redis ]; then extra=" $(median "$wl" "$pct" "$cfg" 10 | awk '{printf "%.0f", $1}') |"; fi
        printf '| %s %% (%s MiB) | %s | %.2f | %s | %.0f | %.0f | %.0f |%s\n' "$pct" "$(cap_mib "$wl" "$pct")" "$label" "$s" \
          "$ratio" "$(median "$wl" "$pct" "$cfg" 6)" "$(median "$wl" "$pct" "$cfg" 8)" "$(median "$wl" "$pct" "$cfg" 9)" "$extra"
      done
    done
  done
  echo
  echo "Every run (workload cap% config round wall_s backend_faults issued installed used redis_ops_per_s):"
  echo
  sed 's/^/    /' "$raw"
  if [ -s "$hungs" ]; then
    echo
    echo "## Runs that hung"
    echo
    echo "Stopped at their limit (${TIMEOUT:+TIMEOUT=$TIMEOUT s}${TIMEOUT:-30x the native time, at least 2 minutes}; the program stuck in a fault farmem did not serve) and left out of the medians:"
    echo
    sed 's/^/    /' "$hungs"
  fi
} >"$out"
echo "prefetch.sh: wrote $out in $(printf %.0f "$total_s") s" >&2
if [ -s "$hungs" ]; then
  echo "prefetch.sh: FAILED: $(wc -l <"$hungs") run(s) hung (see the end of $out):" >&2
  cat "$hungs" >&2
  exit 3
fi
