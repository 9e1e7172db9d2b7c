#!/usr/bin/env bash
# Side-by-side redis benchmark: plain redis-server vs farmem run with a cap above its peak (no
# paging) and at 50 % and 25 % of the peak, in one run. Writes results/redis.md.
# Usage: workloads/bench/redis.sh [KEYS] [REQUESTS]   (make bench; make bench-smoke for a short run)
set -euo pipefail
cd "$(dirname "$0")/../.."
keys=${1:-300000}
reqs=${2:-100000}
size=1000
port=6479
out=${OUT:-results/redis.md}
mkdir -p "$(dirname "$out")"

peak_mib() { echo $(( (keys * (size + 100)) / 1048576 + 16 )); }

run_one() { # name, launcher prefix...
  local name=$1; shift
  "$@" redis-server --port $port --save '' --appendonly no --enable-debug-command yes --bind 127.0.0.1 >/tmp/farmem-bench-$name.log 2>&1 &
  local pid=$!
  local up=0
  for _ in $(seq 100); do redis-cli -p $port ping >/dev/null 2>&1 && { up=1; break; }; sleep 0.05; done
  if [ $up = 0 ]; then
    echo "bench: redis under '$name' did not start; see /tmp/farmem-bench-$name.log" >&2
    kill $pid 2>/dev/null || true
    exit 1
  fi
  local t0=$(date +%s.%N)
  redis-cli -p $port debug populate "$keys" key $size >/dev/null
  local t1=$(date +%s.%N)
  local pop=$(echo "$t1 - $t0" | bc)
  local rss=$(redis-cli -p $port info memory | awk -F: '/^used_memory_rss:/{print int($2/1048576)}')
  local set=$(redis-benchmark -p $port -q -t set -n "$reqs" -r "$keys" -d $size 2>/dev/null | tr '\r' '\n' | awk '/requests per second/{print $2}' | tail -1)
  local get=$(redis-benchmark -p $port -q -t get -n "$reqs" -r "$keys" -d $size 2>/dev/null | tr '\r' '\n' | awk '/requests per second/{print $2}' | tail -1)
  redis-cli -p $port shutdown nosave >/dev/null 2>&1 || true
  wait $pid || true
  echo "$name|$pop|$rss|$set|$get"
}

peak=$(peak_mib)
half=$((peak / 2)); quarter=$((peak / 4))
if [ $quarter -lt 16 ]; then
  echo "bench: $keys keys are too few: 25% of the peak (${quarter}MiB) is below farmem's 16MiB minimum" >&2
  exit 2
fi
rows=()
rows+=("$(run_one plain env)")
rows+=("$(run_one "farmem-nopaging" bin/farmem run --quiet --local-mem $((peak * 2))MiB --)")
rows+=("$(run_one "farmem-50%(${half}MiB)" bin/farmem run --quiet --local-mem ${half}MiB --)")
rows+=("$(run_one "farmem-25%(${quarter}MiB)" bin/farmem run --quiet --local-mem ${quarter}MiB --)")

base_pop=$(echo "${rows[0]}" | cut -d'|' -f2); base_set=$(echo "${rows[0]}" | cut -d'|' -f4); base_get=$(echo "${rows[0]}" | cut -d'|' -f5)
{
  echo "# redis: plain vs farmem (embedded backend), one run"
  echo
  echo "Command: \`workloads/bench/redis.sh $keys $reqs\` on $(nproc) cores, $(uname -r), $(date -u +%Y-%m-%d)."
  echo "DEBUG POPULATE $keys keys of $size B (estimated peak ${peak} MiB); redis-benchmark -n $reqs -r $keys -d $size."
  echo
  echo "| run | populate s | RSS MiB | SET rps | GET rps | populate x plain | SET x plain | GET x plain |"
  echo "|---|---|---|---|---|---|---|---|"
  for r in "${rows[@]}"; do
    IFS='|' read -r n pop rss set get <<<"$r"
    printf '| %s | %.2f | %s | %s | %s | %.2f | %.2f | %.2f |\n' "$n" "$pop" "$rss" "$set" "$get" \
      "$(echo "$base_pop / $pop" | bc -l)" "$(echo "$set / $base_set" | bc -l)" "$(echo "$get / $base_get" | bc -l)"
  done
  echo
  echo "Ratios above 1 are better than plain (populate is time, so x plain = plain time / this time)."
} >"$out"
cat "$out"
