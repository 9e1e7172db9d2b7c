#!/bin/sh
# The cost of tracing on the fault path, side by side (issue 5: within 2 % with the default
# sampling). micro walks MIB MiB at random under a CAP cap, so nearly every access re-faults a
# page from the embedded store; each round runs farmem with tracing off, then on with the
# defaults (--trace-sample 0.01 --trace-slow 100us) exporting OTLP/HTTP to a discarding receiver
# on loopback. Prints a markdown table of pages/s per round and the ratio of the medians.
# ON_FLAGS adds flags to the "on" runs (ON_FLAGS="--trace-slow-max 0": every slow fault traced).
#   ROUNDS=7 MIB=64 CAP=16MiB workloads/bench/telemetry.sh
set -eu
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-7} MIB=${MIB:-64} CAP=${CAP:-16MiB} PORT=${PORT:-4399} ON_FLAGS=${ON_FLAGS:-}
python3 workloads/bench/telemetry/otlpsink.py "$PORT" &
sink=$!
trap 'kill $sink 2>/dev/null' EXIT
sleep 0.5
run() {
	bin/farmem run --quiet --local-mem "$CAP" "$@" -- bin/micro --mib "$MIB" --pattern random --passes 2 2>&1 |
		awk '/pass[12] /{for(i=1;i<=NF;i++) if($i ~ /^pages_per_sec=/){split($i,a,"="); s+=a[2]; n++}} END{if(n) printf "%.0f\n", s/n; else print "FAILED"}'
}
echo "commit $(git rev-parse --short HEAD), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) at start"
echo "command: ROUNDS=$ROUNDS MIB=$MIB CAP=$CAP ON_FLAGS=\"$ON_FLAGS\" workloads/bench/telemetry.sh"
echo
echo "| round | off (pages/s) | on (pages/s) |"
echo "|---|---:|---:|"
offs="" ons=""
for r in $(seq "$ROUNDS"); do
	off=$(run) on=$(run --otlp "127.0.0.1:$PORT" --otlp-protocol http/protobuf $ON_FLAGS)
	echo "| $r | $off | $on |"
	offs="$offs $off" ons="$ons $on"
done
med() { echo "$@" | tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END{print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
mo=$(med $offs) mn=$(med $ons)
echo
echo "median: off $mo, on $mn pages/s: on/off = $(awk -v a="$mn" -v b="$mo" 'BEGIN{printf "%.3f", a/b}')"
echo "load $(cut -d' ' -f1-3 /proc/loadavg) at end"
