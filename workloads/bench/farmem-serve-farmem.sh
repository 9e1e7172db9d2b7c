#!/bin/sh
# farmem with every fault served in farmem's own process (--serve-faults farmem), as before faults
# were served in the program: the farmem-before configuration of bin/farmem-bench, side by side
# with the default (-before workloads/bench/farmem-serve-farmem.sh). FARMEM: the build to run.
bin=${FARMEM:-$(dirname "$0")/../../bin/farmem}
if [ "$1" = run ]; then
	shift
	exec "$bin" run --serve-faults farmem "$@"
fi
exec "$bin" "$@"
