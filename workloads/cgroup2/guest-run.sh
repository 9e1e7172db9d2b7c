#!/bin/sh
# The cgroup v2 test guest's payload (busybox sh, as root, from /payload): each stage prints
# "CG2-STAGE: PASS" or "CG2: FAIL why" and stops at the first failure. The host script
# (workloads/cgroup2/test-cgroup2.sh) requires every PASS line.
cg=/sys/fs/cgroup
fail() { echo "CG2: FAIL $*"; exit 1; }
# jnum KEY FILE: a top-level number of farmem's --summary-json (json.MarshalIndent's layout).
jnum() { sed -n -E "s/^  \"$1\": (-?[0-9]+),?$/\1/p" "$2"; }
jbool() { sed -n -E "s/^  \"$1\": (true|false),?$/\1/p" "$2"; }
# events FILE KEY: a count in memory.events.
events() { awk -v k="$2" '$1 == k {print $2}' "$1"; }
# scope NAME CMD...: run CMD alone in a new cgroup NAME, as `systemd-run --scope` runs a command
# (the memory controller is the root's to give: enabled in its cgroup.subtree_control).
scope() {
  grep -qw memory $cg/cgroup.subtree_control || echo +memory > $cg/cgroup.subtree_control
  d=$cg/$1; shift
  mkdir $d || fail "mkdir $d"
  sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$d" "$@"
}
# clean NAME: farmem left the scope as it found it (no child cgroup, no controller enabled).
clean() {
  [ -z "$(ls -d $cg/$1/*/ 2>/dev/null)" ] || fail "cgroups left behind in $1: $(ls -d $cg/$1/*/)"
  [ -z "$(cat $cg/$1/cgroup.subtree_control)" ] || fail "$1's cgroup.subtree_control is left at '$(cat $cg/$1/cgroup.subtree_control)'"
}
slack=$((4 << 20)) # cmd/farmem's capSlack: what the cgroup counts that the cap does not

# 0. Cgroup v2 only, and farmem doctor says what a run will do with it.
grep -q "^cgroup2 $cg cgroup2 " /proc/mounts || fail "no cgroup2 at $cg"
mkdir -p /tmp/v1
! mount -t cgroup -o memory cgroup /tmp/v1 2>/dev/null || fail "a cgroup v1 memory hierarchy could be mounted"
[ "$(cat /proc/self/cgroup)" = "0::/" ] || fail "/proc/self/cgroup is not v2's alone: $(cat /proc/self/cgroup)"
./farmem doctor > /tmp/doctor.log 2>&1
cat /tmp/doctor.log
grep -q '^ok  *memory cgroup: cgroup v2: ' /tmp/doctor.log || fail "farmem doctor does not say it uses cgroup v2"
echo "CG2-DOCTOR: PASS"

# 1. The watch's own tests: in the root cgroup (which may hold processes and enable controllers
# at once, and where the shared-cgroup refusal is tested), then alone in a scope (farmem moves
# itself into a leaf first, and puts everything back).
./runtime.test -test.run UsageWatch -test.v -test.count=1 > /tmp/rt.log 2>&1
rc=$?
cat /tmp/rt.log
[ $rc = 0 ] || fail "runtime tests exited $rc"
for t in TestUsageWatchSeesTheProgramCross TestUsageWatchRefusesASharedCgroupV2; do
  grep -q -- "^--- PASS: $t " /tmp/rt.log || fail "$t did not run and pass in the root cgroup"
done
scope rt.scope ./runtime.test -test.run '^TestUsageWatchSeesTheProgramCross$' -test.v -test.count=1 > /tmp/rt2.log 2>&1
rc=$?
cat /tmp/rt2.log
[ $rc = 0 ] && grep -q -- "^--- PASS: TestUsageWatchSeesTheProgramCross " /tmp/rt2.log || fail "the watch test in a scope of its own"
clean rt.scope
echo "CG2-RUNTIME: PASS"

# 2. The cap, by the kernel's count: micro (64 MiB, every page verified) at 16 MiB, farmem in
# the root cgroup.
./farmem run --local-mem 16MiB --summary-json /tmp/cap.json -- ./micro --mib 64 --pattern random --passes 1 > /tmp/cap.log 2>&1
rc=$?
cat /tmp/cap.log
[ $rc = 0 ] && grep -q '^micro: OK bad=0' /tmp/cap.log || fail "micro under farmem at 16 MiB (exit $rc)"
peak=$(jnum cgroup_peak_bytes /tmp/cap.json)
[ -n "$peak" ] || fail "no cgroup_peak_bytes in the summary"
echo "cap: the run's cgroup peaked at $peak bytes, cap $((16 << 20))"
[ "$peak" -le $(((16 << 20) + slack)) ] || fail "the run's cgroup peaked at $peak bytes, over the 16 MiB cap and $slack"
[ "$peak" -ge $((8 << 20)) ] || fail "the run's cgroup peaked at $peak bytes: micro was not in it"
echo "CG2-CAP: PASS"

# 3. The arming watch: at a 64 MiB cap a 128 MiB micro crosses the arming level (32 MiB) mid-run,
# farmem alone in a scope. The scope's memory.events is hierarchical and outlives the run's
# cgroup: its "high" count is the run's cgroup's memory.high firing.
scope arm.scope ./farmem run --local-mem 64MiB --summary-json /tmp/arm.json -- ./micro --mib 128 --pattern random --passes 1 > /tmp/arm.log 2>&1
rc=$?
cat /tmp/arm.log
grep -E '^  "(armed|armed_at_bytes|arm_threshold_bytes|arm_watched|cgroup_peak_bytes)"' /tmp/arm.json
[ $rc = 0 ] && grep -q '^micro: OK bad=0' /tmp/arm.log || fail "micro under farmem at 64 MiB (exit $rc)"
[ "$(jbool armed /tmp/arm.json)" = true ] || fail "the run did not arm"
[ "$(jbool arm_watched /tmp/arm.json)" = true ] || fail "the run polled for its arming threshold (arm_watched false)"
at=$(jnum armed_at_bytes /tmp/arm.json) thr=$(jnum arm_threshold_bytes /tmp/arm.json)
[ "$thr" -gt 0 ] && [ "$at" -ge "$thr" ] || fail "armed at $at bytes, threshold $thr: not mid-run"
high=$(events $cg/arm.scope/memory.events high) max=$(events $cg/arm.scope/memory.events max)
echo "arm: memory.events of farmem's scope: high $high, max $max"
[ "$high" -ge 1 ] || fail "memory.high never fired in the run's cgroup"
[ "$max" = 0 ] || fail "the run's cgroup hit a limit ($max times)"
peak=$(jnum cgroup_peak_bytes /tmp/arm.json)
[ -n "$peak" ] && [ "$peak" -le $(((64 << 20) + slack)) ] || fail "the run's cgroup peaked at $peak bytes, over the 64 MiB cap and $slack"
clean arm.scope
echo "CG2-ARM: PASS"

# 4. Linux swap beside farmem at one cap: micro (64 MiB) in a cgroup with memory.max 32 MiB
# swapping to zram (linux-swap.sh), and under farmem at 32 MiB; both verify every page.
lim=$((32 << 20))
./linux-swap.sh run zram 128 $lim -- ./micro --mib 64 --pattern random --passes 1 > /tmp/swap.log 2> /tmp/swap.err
rc=$?
cat /tmp/swap.log /tmp/swap.err
[ $rc = 0 ] && grep -q '^micro: OK bad=0' /tmp/swap.log || fail "micro under linux-swap.sh at 32 MiB (exit $rc)"
st=$(grep '^linux-swap.sh: zram ' /tmp/swap.err)
[ -n "$st" ] || fail "linux-swap.sh printed no stats"
# get KEY: the values of KEY= in the stats line (pswpout twice: before, after).
get() { echo "$st" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
speak=$(get max_usage_bytes) out0=$(get pswpout | sed -n 1p) out1=$(get pswpout | sed -n 2p)
[ "$speak" -le $lim ] || fail "the swap cgroup peaked at $speak bytes, over memory.max $lim"
[ "$out1" -gt "$out0" ] || fail "nothing was swapped out (pswpout $out0 -> $out1)"
[ "$(wc -l < /proc/swaps)" = 1 ] || fail "swap left on: $(cat /proc/swaps)"
[ -z "$(ls -d $cg/farmem-swap-* 2>/dev/null)" ] || fail "linux-swap.sh left its cgroup"
./farmem run --local-mem 32MiB --summary-json /tmp/farmem.json -- ./micro --mib 64 --pattern random --passes 1 > /tmp/farmem.log 2>&1
rc=$?
cat /tmp/farmem.log
[ $rc = 0 ] && grep -q '^micro: OK bad=0' /tmp/farmem.log || fail "micro under farmem at 32 MiB (exit $rc)"
fpeak=$(jnum cgroup_peak_bytes /tmp/farmem.json)
echo "swap: at 32 MiB, zram swap peaked at $speak bytes and swapped out $(((out1 - out0) * 4096)) bytes; farmem's cgroup peaked at $fpeak bytes"
echo "swap: pass1 zram $(sed -n 's/^micro: pass1 .*secs=\([0-9.]*\).*/\1/p' /tmp/swap.log) s, farmem $(sed -n 's/^micro: pass1 .*secs=\([0-9.]*\).*/\1/p' /tmp/farmem.log) s (TCG: not a benchmark)"
echo "CG2-SWAP: PASS"
