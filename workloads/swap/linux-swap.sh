#!/usr/bin/env bash
# linux-swap.sh: the Linux-swap baseline of farmem's benchmarks (issue 6). It runs a program the
# way a user without farmem would cap it: in a memory cgroup (cgroup v1: memory.limit_in_bytes;
# v2: memory.max, with memory.swap.max unbounded as v1's swap is) with swap on, to zram (compressed RAM, built into this kernel) or to a swap file on the root disk.
# As root. Every subcommand is a small step a harness can call; `run` does them all for one
# command and tears down on any exit, failure or signal.
#
#   linux-swap.sh on zram|file MIB   swap on: /dev/zram0 (disksize MIB, lz4) or the swap file
#                                    $SWAPFILE (MIB, fallocate then mkswap), and nothing else:
#                                    refuses if any other swap is active (it would mix devices)
#   linux-swap.sh cgroup NAME LIMIT  (re)create the memory cgroup farmem-swap-NAME with
#                                    memory.limit_in_bytes (v2: memory.max) LIMIT bytes (0: no
#                                    limit)
#   linux-swap.sh exec NAME CMD...   move this shell into the cgroup, then exec CMD (so CMD and
#                                    every child it forks are charged there from the start)
#   linux-swap.sh stats NAME         the cgroup's counters, key=value on one line (the same keys
#                                    on v1 and v2, but v2 has no kernel-memory peak: no
#                                    kmem_max_bytes)
#   linux-swap.sh rmcgroup NAME      remove the cgroup (its processes must have exited)
#   linux-swap.sh off                undo everything this script may have set up: swapoff the
#                                    zram device and the swap file, reset zram, remove the file
#                                    and every farmem-swap-* cgroup; safe to call any time
#   linux-swap.sh run zram|file MIB LIMIT -- CMD...
#                                    on + cgroup + run CMD there + stats (to stderr) + off, with
#                                    a trap so a failure or ^C still tears down; exits as CMD did
#
# What the limit charges: in cgroup v1 memory.limit_in_bytes counts the cgroup's anonymous
# pages, the page cache it brought into the cache (not pages already cached by others, such as
# a binary's and its libraries' when they ran before) and kernel memory (page tables, slab).
# farmem's --local-mem caps anonymous memory only, so a harness comparing the two at "the same
# cap" should give the cgroup cap + the kernel memory the program's native run was charged
# (`stats` says kmem_max_bytes): page cache is reclaimed before anonymous memory is swapped, so
# whatever more the cgroup gets goes to anonymous memory (bin/farmem-bench does: see its report).
#
# Cgroup v2 (where /sys/fs/cgroup is a cgroup2 mount; else v1's /sys/fs/cgroup/memory) counts the
# same and reclaims the same way, with two differences: the cgroup is a child of the root, whose
# cgroup.subtree_control must enable memory (this script enables it if not), and v2 has no
# per-cgroup swappiness, so the machine's vm.swappiness holds (`cgroup` warns unless it is 60).
#
# Env: SWAPFILE (default /var/tmp/farmem-swapfile), ZRAM (default zram0), ZRAM_ALG (lz4).
set -euo pipefail

if grep -q '^[^ ]* /sys/fs/cgroup cgroup2 ' /proc/mounts; then
  V=2 CG=/sys/fs/cgroup
else
  V=1 CG=/sys/fs/cgroup/memory
fi
SWAPFILE=${SWAPFILE:-/var/tmp/farmem-swapfile}
ZRAM=${ZRAM:-zram0}
ZRAM_ALG=${ZRAM_ALG:-lz4}

die() { echo "linux-swap.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (swapon, zram, cgroups)"

cgdir() {
  case $1 in '' | */* | .*) die "bad cgroup name '$1'" ;; esac
  echo "$CG/farmem-swap-$1"
}

# active: the devices/files in /proc/swaps.
active() { awk 'NR > 1 {print $1}' /proc/swaps; }

swap_on() {
  local kind=$1 mib=$2
  case $mib in '' | *[!0-9]*) die "bad size '$mib' (MiB)" ;; esac
  [ "$mib" -ge 1 ] || die "size must be at least 1 MiB"
  if [ $V = 1 ]; then
    [ -d $CG ] || die "no cgroup v1 memory controller at $CG, and /sys/fs/cgroup is not cgroup v2"
  else
    grep -qw memory $CG/cgroup.controllers || die "cgroup v2 at $CG has no memory controller"
  fi
  local a; a=$(active)
  [ -z "$a" ] || die "swap is already active ($(echo $a)): refusing to mix devices; 'linux-swap.sh off' removes ours"
  case $kind in
    zram)
      local z=/sys/block/$ZRAM
      if [ ! -d $z ]; then
        modprobe zram num_devices=1 2>/dev/null || true
      fi
      [ -d $z ] || die "no /sys/block/$ZRAM (zram not in this kernel?)"
      echo 1 >$z/reset
      # The compressor must be chosen before disksize; fall back to the kernel's default.
      echo "$ZRAM_ALG" >$z/comp_algorithm 2>/dev/null || echo "linux-swap.sh: $ZRAM_ALG refused, using $(cat $z/comp_algorithm)" >&2
      echo $((mib << 20)) >$z/disksize
      mkswap /dev/$ZRAM >/dev/null
      swapon /dev/$ZRAM
      ;;
    file)
      rm -f "$SWAPFILE"
      # fallocate is instant on ext4, and ext4 accepts preallocated swap files; dd if it cannot.
      fallocate -l $((mib << 20)) "$SWAPFILE" 2>/dev/null ||
        dd if=/dev/zero of="$SWAPFILE" bs=1M count="$mib" status=none
      chmod 600 "$SWAPFILE"
      mkswap "$SWAPFILE" >/dev/null
      swapon "$SWAPFILE"
      ;;
    *) die "unknown swap kind '$kind' (zram or file)" ;;
  esac
}

swap_off() {
  local st=0
  if grep -q "^/dev/$ZRAM " /proc/swaps; then swapoff /dev/$ZRAM || st=1; fi
  if grep -q "^$SWAPFILE " /proc/swaps; then swapoff "$SWAPFILE" || st=1; fi
  if [ -e /sys/block/$ZRAM/reset ] && ! grep -q "^/dev/$ZRAM " /proc/swaps; then
    echo 1 >/sys/block/$ZRAM/reset 2>/dev/null || st=1
  fi
  if ! grep -q "^$SWAPFILE " /proc/swaps; then rm -f "$SWAPFILE"; fi
  local d
  for d in "$CG"/farmem-swap-*; do
    [ -d "$d" ] || continue
    # A cgroup with a live process cannot go; its processes are ours, so kill them first.
    local p
    for p in $(cat "$d/cgroup.procs" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    for _ in $(seq 50); do rmdir "$d" 2>/dev/null && break; sleep 0.1; done
    [ ! -d "$d" ] || { echo "linux-swap.sh: could not remove $d" >&2; st=1; }
  done
  return $st
}

cgroup_make() {
  local d; d=$(cgdir "$1")
  local limit=$2
  case $limit in '' | *[!0-9]*) die "bad limit '$limit' (bytes)" ;; esac
  [ ! -d "$d" ] || rmdir "$d" || die "$d exists and cannot be removed (a process still in it?)"
  if [ $V = 2 ]; then
    cgroup2_make "$d" "$limit"
    return
  fi
  mkdir "$d"
  # v1 charges nested cgroups to their parent; our parent is the root, with no limit.
  if [ "$limit" -gt 0 ]; then
    echo "$limit" >"$d/memory.limit_in_bytes"
    local got; got=$(cat "$d/memory.limit_in_bytes")
    # The kernel rounds the limit down to a page.
    [ "$got" -le "$limit" ] && [ "$got" -gt $((limit - 4096)) ] || die "memory.limit_in_bytes is $got, wanted $limit"
  fi
  # The default (60) as a stated constant, so a machine whose root cgroup was tuned differently
  # still swaps the same way; no OOM kill while swap has room.
  echo 60 >"$d/memory.swappiness"
}

# cgroup2_make DIR LIMIT: cgroup_make on cgroup v2.
cgroup2_make() {
  local d=$1 limit=$2
  # The root may hold processes and enable controllers for its children at once (no other
  # cgroup may); systemd enables memory there at boot, a bare init does not.
  grep -qw memory $CG/cgroup.subtree_control || echo +memory >$CG/cgroup.subtree_control
  mkdir "$d"
  if [ "$limit" -gt 0 ]; then
    echo "$limit" >"$d/memory.max"
    local got; got=$(cat "$d/memory.max")
    [ "$got" != max ] && [ "$got" -le "$limit" ] && [ "$got" -gt $((limit - 4096)) ] || die "memory.max is $got, wanted $limit"
  fi
  # As v1's limit: memory only, swap as much as the device holds (the default, stated).
  echo max >"$d/memory.swap.max"
  local sw; sw=$(cat /proc/sys/vm/swappiness)
  [ "$sw" = 60 ] || echo "linux-swap.sh: vm.swappiness is $sw, not the default 60 that v1's runs set per cgroup (v2 has no per-cgroup swappiness)" >&2
}

# key N: the value of key in a flat-keyed cgroup file (memory.stat, memory.events) on stdin.
key() { awk -v k="$1" '$1 == k {print $2; f = 1} END {if (!f) print 0}'; }

stats() {
  local d; d=$(cgdir "$1")
  [ -d "$d" ] || die "no cgroup $d"
  if [ $V = 2 ]; then
    # memory.peak is Linux 5.19's; memory.events' max counts the charges that hit the limit,
    # as v1's failcnt; no kernel-memory peak (memory.stat's kernel is the current amount).
    [ -r "$d/memory.peak" ] || die "no $d/memory.peak (Linux 5.19 and later)"
    local s; s=$(cat "$d/memory.stat")
    echo "max_usage_bytes=$(cat "$d/memory.peak") failcnt=$(key max <"$d/memory.events")" \
      "rss=$(echo "$s" | key anon) cache=$(echo "$s" | key file) swap=$(cat "$d/memory.swap.current")" \
      "pgmajfault=$(echo "$s" | key pgmajfault) pgfault=$(echo "$s" | key pgfault)" \
      "oom_kills=$(key oom_kill <"$d/memory.events") kernel_bytes=$(echo "$s" | key kernel)"
    return
  fi
  local out="max_usage_bytes=$(cat "$d/memory.max_usage_in_bytes") failcnt=$(cat "$d/memory.failcnt")"
  out="$out $(awk '$1 ~ /^total_(rss|cache|swap|pgmajfault|pgfault|pgpgin|pgpgout)$/ {sub(/^total_/, "", $1); printf "%s=%s ", $1, $2}' "$d/memory.stat")"
  out="$out oom_kills=$(awk '$1 == "oom_kill" {print $2}' "$d/memory.oom_control")"
  # Kernel memory (page tables, slab): absent where the kernel was booted with cgroup.memory=nokmem.
  [ ! -r "$d/memory.kmem.max_usage_in_bytes" ] || out="$out kmem_max_bytes=$(cat "$d/memory.kmem.max_usage_in_bytes")"
  echo "$out"
}

vmstat_swaps() { awk '$1 == "pswpin" || $1 == "pswpout" {printf "%s=%s ", $1, $2}' /proc/vmstat; }

cmd=${1:-}
shift || true
case $cmd in
  on) [ $# = 2 ] || die "usage: linux-swap.sh on zram|file MIB"; swap_on "$1" "$2" ;;
  off) swap_off ;;
  cgroup) [ $# = 2 ] || die "usage: linux-swap.sh cgroup NAME LIMIT_BYTES"; cgroup_make "$1" "$2" ;;
  exec)
    [ $# -ge 2 ] || die "usage: linux-swap.sh exec NAME CMD..."
    d=$(cgdir "$1"); shift
    [ -d "$d" ] || die "no cgroup $d"
    echo $$ >"$d/cgroup.procs"
    exec "$@" ;;
  stats) [ $# = 1 ] || die "usage: linux-swap.sh stats NAME"; stats "$1" ;;
  rmcgroup) [ $# = 1 ] || die "usage: linux-swap.sh rmcgroup NAME"; d=$(cgdir "$1"); [ ! -d "$d" ] || rmdir "$d" ;;
  run)
    [ $# -ge 5 ] && [ "$4" = -- ] || die "usage: linux-swap.sh run zram|file MIB LIMIT_BYTES -- CMD..."
    kind=$1 mib=$2 limit=$3; shift 4
    name=run$$
    trap 'swap_off || echo "linux-swap.sh: teardown incomplete: see /proc/swaps and $CG" >&2' EXIT
    trap 'exit 130' INT TERM HUP
    swap_on "$kind" "$mib"
    cgroup_make "$name" "$limit"
    before=$(vmstat_swaps)
    st=0
    "$0" exec "$name" "$@" || st=$?
    echo "linux-swap.sh: $kind limit=$limit status=$st $(stats "$name") before: $before after: $(vmstat_swaps)" >&2
    exit $st ;;
  *) die "usage: linux-swap.sh on|off|cgroup|exec|stats|rmcgroup|run ... (see the head of the script)" ;;
esac
