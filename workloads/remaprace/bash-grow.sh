#!/bin/bash
# An eviction batch racing the program's mremaps (docs/DESIGN.md, "Evicting a page", the last
# point): bash reads 40 MB of base64 into a variable, growing it 4 KiB at a time; glibc's
# realloc cannot grow it in place, so each growth is an mremap that moves the whole buffer, back
# and forth between two places a few pages apart. Under a cap of 16 MiB farmem evicts the buffer
# while it moves; a batch that chose a page at one address and moved the page found there after
# two such moves took another page, and the run stops with "page ... is absent from the program
# though farmem records it resident".
#
#   farmem run --local-mem 16MiB -- bash workloads/remaprace/bash-grow.sh
#
# Prints len=40000000 last=200 when it ran through.
x=$(head -c 30000000 /dev/urandom | base64 -w0)
for i in $(seq 200); do y=$( (echo $i; /bin/true) | cat ); z=$(/bin/echo $y); done
echo len=${#x} last=$z
