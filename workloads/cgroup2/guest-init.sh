#!/bin/busybox sh
# /init of the cgroup v2 test guest: mount the unified hierarchy (the only one: the kernel was
# booted with cgroup_no_v1=all), load zram's modules, run /payload/run, power off. Everything it
# prints goes to the serial console, which the host parses (workloads/cgroup2/test-cgroup2.sh).
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo "guest: up $(cut -d' ' -f1 /proc/uptime)s"
fail() { echo "guest: FAIL $*"; poweroff -f; }
for m in $(cat /lib/modules/order); do
  insmod "/lib/modules/$m.ko" || fail "insmod $m"
done
cd /payload
sh ./run
echo "guest: run exited $? at $(cut -d' ' -f1 /proc/uptime)s"
poweroff -f
