#!/bin/busybox sh
# /init of the rdma test guest: load the modules, put rdma_rxe on a dummy netdev, run
# /payload/run, power off. Everything it prints goes to the serial console, which the host
# parses (workloads/rdma/test-rdma.sh).
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
echo "guest: up $(cut -d' ' -f1 /proc/uptime)s"
fail() { echo "guest: FAIL $*"; poweroff -f; }
# crc32_generic first: rdma_rxe needs a crc32 shash, and TCG's CPU has no PCLMUL for the
# accelerated one.
for m in $(cat /lib/modules/order); do
  insmod "/lib/modules/$m.ko" || fail "insmod $m"
done
ip link set lo up || fail "lo up"
ip link set dummy0 up || fail "dummy0 up"
rdma link add rxe0 type rxe netdev dummy0 || fail "rdma link add"
echo "guest: rxe0 on dummy0 at $(cut -d' ' -f1 /proc/uptime)s"
cd /payload
sh ./run
echo "guest: run exited $? at $(cut -d' ' -f1 /proc/uptime)s"
poweroff -f
