#!/usr/bin/env bash
# Side-by-side redis benchmark: plain redis-server vs farmem run with a cap above its peak (no
# paging) and at 50 % and 25 % of the peak (and at 25 % with the embedded store compressing), ROUNDS times interleaved so that machine
# drift hits every configuration alike; the table holds each configuration's median.
# Every run's data is checked after its measured phases (verify_lua), and a run whose redis (or
# farmem) exits non-zero fails the benchmark.
# Guest memory is warmed before every run (first touch of cold guest memory costs ~10 us/page
# here, which would bill whichever run came first).
# Usage: workloads/bench/redis.sh [KEYS] [REQUESTS]   (make bench; make bench-smoke for a short run)
# Env: ROUNDS (default 5), OUT (default results/redis.md), ONLY (a list of configuration numbers,
# 0 = plain .. 5 = 25%-zstd, default all: ONLY="0 1" compares plain and no paging alone).
set -euo pipefail
cd "$(dirname "$0")/../.."
keys=${1:-300000}
reqs=${2:-100000}
rounds=${ROUNDS:-5}
size=1000
port=6479
out=${OUT:-results/redis.md}
mkdir -p "$(dirname "$out")"

peak_mib() { echo $(( (keys * (size + 100)) / 1048576 + 16 )); }

# Each farmem run writes its summary, in raw numbers, here (--summary-json).
summary=/tmp/farmem-bench-summary.$$.json
trap 'rm -f "$summary"' EXIT

# quantile SOURCE Q: the fault-service latency (Q: p50 or p99) of SOURCE's faults in the last
# farmem run, in microseconds; "-" for a run without farmem or without such faults.
quantile() {
  local v
  [ -s "$summary" ] || { echo "-"; return; }
  v=$(jq -r --arg s "$1" --arg q "$2" '.faults[$s] | if . == null or .count == 0 then "-" else (.[$q + "_ns"] / 1000) end' "$summary")
  case "$v" in
    -) echo "-" ;;
    *) printf '%.1f\n' "$v" ;;
  esac
}

run_one() { # name, launcher prefix...
  local name=$1; shift
  local log=/tmp/farmem-bench-$name.log
  dd if=/dev/zero of=/dev/null bs=1G count=1 2>/dev/null
  rm -f "$summary"
  "$@" redis-server --port $port --save '' --appendonly no --enable-debug-command yes --bind 127.0.0.1 >"$log" 2>&1 &
  local pid=$!
  local up=0
  for _ in $(seq 100); do redis-cli -p $port ping >/dev/null 2>&1 && { up=1; break; }; sleep 0.05; done
  if [ $up = 0 ]; then
    echo "bench: redis under '$name' did not start; see $log" >&2
    kill $pid 2>/dev/null || true
    exit 1
  fi
  local t0=$(date +%s.%N)
  redis-cli -p $port debug populate "$keys" key $size >/dev/null
  local t1=$(date +%s.%N)
  local pop=$(echo "$t1 - $t0" | bc)
  local rss=$(redis-cli -p $port info memory | awk -F: '/^used_memory_rss:/{print int($2/1048576)}')
  local set get
  set=$(redis-benchmark -p $port -q -t set -n "$reqs" -r "$keys" -d $size 2>/dev/null | tr '\r' '\n' | awk '/requests per second/{print $2}' | tail -1)
  get=$(redis-benchmark -p $port -q -t get -n "$reqs" -r "$keys" -d $size 2>/dev/null | tr '\r' '\n' | awk '/requests per second/{print $2}' | tail -1)
  if [ -z "$set" ] || [ -z "$get" ]; then
    fail "$name" $pid "$log" "redis-benchmark gave no rate (SET '$set', GET '$get')"
  fi
  # What redis holds is checked after the measured phases (so the check costs them nothing):
  # every populated key must still hold what DEBUG POPULATE wrote ("value:N", NUL-padded to
  # $size bytes), and every key the SET phase wrote (key:000000NNNNNN) the one value of $size
  # bytes redis-benchmark writes to all of them. The script runs inside redis, so under farmem
  # every page it reads comes back through the cap.
  local check bad seen
  check=$(redis-cli -p $port --no-raw eval "$verify_lua" 0 "$keys" "$size" 2>&1 | tr -d '()' | awk '{printf "%s ", $NF}')
  read -r bad seen <<<"$check"
  if [ "$bad" != 0 ] || [ -z "$seen" ]; then
    fail "$name" $pid "$log" "DATA CHECK FAILED: $bad of $keys populated + ${seen:-?} SET keys read back wrong (redis-cli said: $check)"
  fi
  redis-cli -p $port shutdown nosave >/dev/null 2>&1 || true
  local rc=0
  wait $pid || rc=$?
  if [ $rc != 0 ]; then
    echo "bench: redis under '$name' exited with status $rc (farmem's, when it ran redis); see $log" >&2
    tail -5 "$log" >&2
    exit 1
  fi
  echo "$name|$pop|$rss|$set|$get|$(quantile zero p50)|$(quantile zero p99)|$(quantile backend p50)|$(quantile backend p99)|$((keys + seen))"
}

# fail NAME PID LOG WHY: the run is not a result; stop redis (and farmem) and the benchmark.
fail() {
  echo "bench: redis under '$1': $4; see $3" >&2
  kill "$2" 2>/dev/null || true
  wait "$2" 2>/dev/null || true
  exit 1
}

# The data check, run in redis by EVAL: {wrong values, SET-phase keys seen}.
verify_lua='
local n, size, bad, seen = tonumber(ARGV[1]), tonumber(ARGV[2]), 0, 0
for i = 0, n - 1 do
  local v, p = redis.call("GET", "key:" .. i), "value:" .. i
  if not v or #v ~= size or v:sub(1, #p) ~= p or v:find("[^%z]", #p + 1) then bad = bad + 1 end
end
local ref
for _, k in ipairs(redis.call("KEYS", "key:000000*")) do
  local v = redis.call("GET", k)
  seen, ref = seen + 1, ref or v
  if not v or #v ~= size or v ~= ref then bad = bad + 1 end
end
return {bad, seen}'

commit=$(git rev-parse --short HEAD 2>/dev/null || echo "(unknown commit)")
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit with uncommitted changes"
peak=$(peak_mib)
half=$((peak / 2)); quarter=$((peak / 4))
if [ $quarter -lt 16 ]; then
  echo "bench: $keys keys are too few: 25% of the peak (${quarter}MiB) is below farmem's 16MiB minimum" >&2
  exit 2
fi
names=(plain farmem-nopaging "farmem-50%(${half}MiB)" "farmem-25%(${quarter}MiB)" "farmem-25%-lz4" "farmem-25%-zstd")
prefix=(env
  "bin/farmem run --summary-json $summary --local-mem $((peak * 2))MiB --"
  "bin/farmem run --summary-json $summary --local-mem ${half}MiB --"
  "bin/farmem run --summary-json $summary --local-mem ${quarter}MiB --"
  "bin/farmem run --summary-json $summary --compress lz4 --local-mem ${quarter}MiB --"
  "bin/farmem run --summary-json $summary --compress zstd --local-mem ${quarter}MiB --")
only=${ONLY:-0 1 2 3 4 5}
case " $only " in *" 0 "*) ;; *) only="0 $only" ;; esac # ratios need plain
sel=()
for i in $only; do sel+=("${names[$i]}"); done
raw=()
for r in $(seq "$rounds"); do
  for i in $only; do
    # shellcheck disable=SC2086 # the prefix is words on purpose
    raw+=("$(run_one "${names[$i]}" ${prefix[$i]})")
  done
done
names=("${sel[@]}")

# median NAME FIELD: the median over the rounds of one configuration's field.
median() {
  printf '%s\n' "${raw[@]}" | awk -F'|' -v n="$1" -v f="$2" '$1 == n {print $f}' | sort -g |
    awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
base_pop=$(median plain 2); base_set=$(median plain 4); base_get=$(median plain 5)
{
  echo "# redis: plain vs farmem (embedded backend), medians of $rounds interleaved rounds"
  echo
  echo "Command: \`ROUNDS=$rounds${ONLY:+ ONLY=\"$ONLY\"} workloads/bench/redis.sh $keys $reqs\` on $(nproc) cores, $(uname -r), $(date -u +%Y-%m-%d), farmem $commit."
  echo "DEBUG POPULATE $keys keys of $size B (estimated peak ${peak} MiB); redis-benchmark -n $reqs -r $keys -d $size."
  echo
  echo "| run | populate s | RSS MiB | SET rps | GET rps | populate x plain | SET x plain | GET x plain | zero-fill p50/p99 us | backend p50/p99 us |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  for n in "${names[@]}"; do
    pop=$(median "$n" 2); rss=$(median "$n" 3); set=$(median "$n" 4); get=$(median "$n" 5)
    zl="$(median "$n" 6)/$(median "$n" 7)"; bl="$(median "$n" 8)/$(median "$n" 9)"
    [ "$n" = plain ] && zl=- && bl=-
    printf '| %s | %.2f | %s | %.0f | %.0f | %.2f | %.2f | %.2f | %s | %s |\n' "$n" "$pop" "$rss" "$set" "$get" \
      "$(echo "$base_pop / $pop" | bc -l)" "$(echo "$set / $base_set" | bc -l)" "$(echo "$get / $base_get" | bc -l)" "$zl" "$bl"
  done
  echo
  echo "Ratios above 1 are better than plain (populate is time, so x plain = plain time / this time)."
  echo "Fault-service latency is farmem's own: from reading the fault to the install ioctl's return,"
  echo "waits at the cap included (the program also pays the two context switches around it)."
  echo "A run whose memory stays below its cap is never armed and takes no fault (-/-)."
  echo "The -lz4/-zstd rows are the 25 % cap with \`--compress\`; the default stores pages raw."
  echo
  echo "Every run was checked after its GET phase, by a script run in redis: each of the $keys populated keys"
  echo "holds what DEBUG POPULATE wrote, and the keys the SET phase wrote all hold the one $size-byte value redis-benchmark writes; a wrong"
  echo "value, or redis (or farmem running it) exiting non-zero, fails the benchmark. The SET and GET phases use"
  echo "redis-benchmark's own keys (key:000000NNNNNN), not the populated ones: GETs read what the SETs wrote, or miss."
  echo
  echo "Every run (name|populate s|RSS MiB|SET|GET|zero p50|zero p99|backend p50|backend p99|keys checked):"
  echo
  printf '    %s\n' "${raw[@]}"
} >"$out"
cat "$out"
