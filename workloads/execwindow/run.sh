#!/bin/sh
# The exec window, side by side: execwindow natively and under farmem run (a cap it never
# reaches, so nothing pages and every gap is farmem's entering or the scheduler's), ROUNDS
# children each, rows kept as printed. Writes results/execwindow/rows.txt.
#   ROUNDS=20 workloads/execwindow/run.sh
set -eu
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-20}
out=results/execwindow
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gcc -O2 -o "$tmp/execwindow" workloads/execwindow/execwindow.c
gcc -O2 -static -o "$tmp/execwindow-static" workloads/execwindow/execwindow.c
{
	echo "commit $(git rev-parse --short HEAD), $(uname -r), $(nproc) CPUs, $(date -u '+%Y-%m-%d %H:%M') UTC"
	echo "command: ROUNDS=$ROUNDS workloads/execwindow/run.sh"
	echo "## native"
	"$tmp/execwindow" "$ROUNDS" "$tmp/execwindow-static"
	echo "## farmem run --local-mem 2GiB"
	bin/farmem run --quiet --local-mem 2GiB -- "$tmp/execwindow" "$ROUNDS" "$tmp/execwindow-static"
} | tee "$out/rows.txt"
