#!/usr/bin/env bash
# test-cgroup2.sh: farmem on a cgroup v2-only machine, for real, in a qemu guest.
#
# This machine mounts cgroup v1 (and a controller-less v2 beside it), so the test boots Debian's
# kernel (the one linux-image-amd64 names, as workloads/rdma/test-rdma.sh does, from the same
# kind of cache) under qemu-system-x86_64 with TCG and cgroup_no_v1=all: no v1 controller can
# be mounted at all. There is no systemd: the guest's /init (guest-init.sh) mounts cgroup2 at
# /sys/fs/cgroup, and processes start in the root cgroup; where a stage wants farmem alone in
# a cgroup of its own, as `systemd-run --scope -p Delegate=yes` would start it, it makes one.
# The initramfs is busybox-static, bash (for linux-swap.sh) and the payload with the shared
# libraries it needs.
#
# Stages (guest-run.sh; each must pass): farmem doctor says it uses cgroup v2; the watch's
# tests (go test -c -race ./runtime/ -run UsageWatch) in the root cgroup and alone in a scope; a
# 16 MiB cap held by the run's cgroup's own peak (memory.peak); a run that arms mid-way armed
# by the watch (the summary's arm_watched, and memory.high's event counted in farmem's scope);
# and Linux swap (workloads/swap/linux-swap.sh on zram with memory.max) beside farmem at one
# cap, both verifying every page.
#
# Cache: the kernel and the zram modules go to $CGROUP2_CACHE (default .cache/cgroup2-guest,
# git-ignored); delete it to fetch the current kernel again. Needs root for apt-get only when a
# package is missing. Environment: CGROUP2_TIMEOUT (seconds for the guest, default 200),
# QEMU_SMP (default 2), CGROUP2_KERNEL_PKG (a linux-image package to boot instead).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
here=$repo/workloads/cgroup2
cache=${CGROUP2_CACHE:-$repo/.cache/cgroup2-guest}
guest_timeout=${CGROUP2_TIMEOUT:-200}
smp=${QEMU_SMP:-2}
GO=${GO:-go}
. "$repo/workloads/qemu/guest-kernel.sh"
t0=$(date +%s)
say() { echo "test-cgroup2: $*"; }
die() { echo "test-cgroup2: FAIL: $*" >&2; exit 1; }

# 1. Host packages: qemu, busybox for the guest's init, kmod's modinfo for module dependencies.
need_packages qemu-system-x86 busybox-static cpio kmod gcc

# 2. The guest kernel and zram's modules (lz4 for linux-swap.sh's compressor), with their
# dependencies in load order.
guest_kernel "$cache" "${CGROUP2_KERNEL_PKG:-}" lz4 zram
[ -s "$cache/mods/zram.ko" ] || die "zram is not a module of $(cat "$cache/kernel")"
say "kernel $(cat "$cache/kernel"), modules: $(tr '\n' ' ' < "$cache/mods/order")"

# 3. The payload: farmem, micro, the runtime package's tests, linux-swap.sh and bash to run it.
work=$(mktemp -d)
root=$work/root
trap 'rm -rf "$work"' EXIT
(cd "$repo" && make -s shim bin/micro && $GO build -o "$work/farmem" ./cmd/farmem) || die "building farmem"
(cd "$repo" && $GO test -c -race -o "$work/runtime.test" ./runtime/) || die "go test -c -race ./runtime/"
mkdir -p "$root"/{bin,usr/bin,dev,proc,sys,tmp,etc,payload,lib/modules}
cp /bin/busybox "$root/bin/busybox"
cp /bin/bash "$root/bin/bash"
ln -s /bin/busybox "$root/usr/bin/env" # linux-swap.sh's #!/usr/bin/env bash
cp "$here/guest-init.sh" "$root/init"
cp "$cache/mods"/*.ko "$cache/mods/order" "$root/lib/modules/"
cp "$work/farmem" "$work/runtime.test" "$repo/bin/micro" "$repo/workloads/swap/linux-swap.sh" "$root/payload/"
cp "$here/guest-run.sh" "$root/payload/run"
# The shim (embedded in farmem, preloaded into micro) needs what micro's libc does.
for e in /bin/bash "$work/farmem" "$work/runtime.test" "$repo/bin/micro" "$repo/launcher/shim/libfarmem.so"; do
  { ldd "$e" 2>/dev/null || true; } | { grep -oE '/[^ ]+' || true; } | while read -r lib; do # a static binary names none
    [ -e "$root$lib" ] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
done
(cd "$root" && find . | cpio -o -H newc --quiet) | gzip -1 > "$work/initrd.gz"
say "payload built in $(($(date +%s) - t0))s; booting the guest (TCG, timeout ${guest_timeout}s)"

# 4. Boot with cgroup v1 off (cgroup_no_v1=all; systemd.unified_cgroup_hierarchy=1 is what a
# systemd guest would need too, and harmless here), the console on stdout and in a log.
log=${CGROUP2_LOG:-$repo/.cache/test-cgroup2.log}
mkdir -p "$(dirname "$log")"
t1=$(date +%s)
set +e
timeout --foreground -k 5 "$guest_timeout" qemu-system-x86_64 -accel tcg -m 1024 -smp "$smp" \
  -nographic -no-reboot -nic none -kernel "$cache/vmlinuz" -initrd "$work/initrd.gz" \
  -append "console=ttyS0 quiet loglevel=4 panic=-1 cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1" </dev/null 2>&1 | tr -d '\r' | tee "$log"
qrc=${PIPESTATUS[0]}
set -e
say "guest ran $(($(date +%s) - t1))s (qemu exit $qrc), whole run $(($(date +%s) - t0))s; console in $log"
[ "$qrc" = 124 ] && die "the guest did not power off within ${guest_timeout}s"
for stage in DOCTOR RUNTIME CAP ARM SWAP; do
  grep -q "^CG2-$stage: PASS" "$log" || die "stage $stage did not pass ($(grep -m1 '^CG2: FAIL' "$log" || echo 'no verdict'); see $log)"
done
say "PASS"
