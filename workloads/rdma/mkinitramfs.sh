#!/usr/bin/env bash
# mkinitramfs.sh OUT.cpio.gz MODDIR PAYLOAD... : a minimal initramfs for the rdma test guest.
#
# busybox-static is /init's shell and tools; MODDIR holds the kernel modules, loaded in the order
# of MODDIR/order; each PAYLOAD (an ELF binary) goes to /payload/ with every shared library
# ldd names, the rxe verbs provider and its driver file. workloads/rdma/guest-init.sh becomes
# /init and runs /payload/run (copied from the first payload argument named "run", if any).
set -euo pipefail
out=$1 moddir=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

mkdir -p "$root"/{bin,dev,proc,sys,tmp,etc,payload,lib/modules}
cp /bin/busybox "$root/bin/busybox"
cp "$here/guest-init.sh" "$root/init"
chmod +x "$root/init"
cp "$moddir"/*.ko "$moddir/order" "$root/lib/modules/"

# The rxe provider is dlopen'ed by libibverbs: ldd of the payload does not name it.
libdir=/usr/lib/x86_64-linux-gnu
elfs=(/usr/bin/rdma "$libdir/libibverbs/librxe-rdmav34.so")
mkdir -p "$root/etc/libibverbs.d" "$root/$libdir/libibverbs" "$root/usr/bin"
cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
cp "$libdir/libibverbs/librxe-rdmav34.so" "$root/$libdir/libibverbs/"
cp /usr/bin/rdma "$root/usr/bin/rdma"
for p in "$@"; do
  cp "$p" "$root/payload/"
  [ "$(head -c4 "$p" | tail -c3)" = ELF ] && elfs+=("$p")
done
for e in "${elfs[@]}"; do
  ldd "$e" 2>/dev/null | grep -oE '/[^ ]+' | while read -r lib; do
    [ -e "$root$lib" ] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
done
(cd "$root" && find . | cpio -o -H newc --quiet) | gzip -1 > "$out"
