/**
 * The shell scripts that boot a QEMU guest. `/init` runs from the initramfs: it loads the virtio
 * modules (the cloud kernel builds them as modules), mounts the sandbox's disk (found by its
 * serial) as the root, puts the agent on a read-only tmpfs at /opt/bothy (the template never
 * holds the agent, as with gVisor's bind mount) and switches root. PID 1 after that is a small busybox shell that starts
 * the agent, reaps orphans, and powers the VM off when the agent ends.
 */

/** The virtio-serial port name the host gives the agent's channel. */
export const AGENT_PORT_NAME = "bothy.agent";

/** The serial of a VM's root disk (the guest agent's block-devices.ts has the same). */
export const ROOT_SERIAL = "bothy-root";

/** The serial of a VM's `index`th volume disk (at most 20 characters: virtio-blk's limit). */
export const volumeSerial = (index: number): string => `bothy-vol-${index}`;

/** Module files under `lib/modules/<release>/kernel`, in load order (each needs the ones before). */
export const GUEST_MODULES = [
  "drivers/virtio/virtio_ring.ko",
  "drivers/virtio/virtio.ko",
  "drivers/virtio/virtio_mmio.ko",
  "drivers/block/virtio_blk.ko",
  "drivers/char/virtio_console.ko",
  "net/core/failover.ko",
  "drivers/net/net_failover.ko",
  "drivers/net/virtio_net.ko",
] as const;

/** Applets the init script calls by name; linked to busybox in the initramfs. */
export const INIT_APPLETS = [
  "sh",
  "mount",
  "umount",
  "insmod",
  "mkdir",
  "cat",
  "cp",
  "sleep",
  "switch_root",
  "echo",
  "reboot",
] as const;

export const INIT_SCRIPT = `#!/bin/sh
# bothy initramfs /init: see packages/server/src/images/guest-init.ts
fail() { echo "bothy-init: $*" >/dev/console; sleep 1; reboot -f; }
mkdir -p /dev /proc /sys /newroot
mount -t devtmpfs devtmpfs /dev
mount -t proc proc /proc
mount -t sysfs sysfs /sys
for m in ${GUEST_MODULES.map((m) => m.split("/").pop()).join(" ")}; do
  insmod /lib/modules/$m || fail "insmod $m failed"
done
# The root is the disk with the host's root serial: a VM with volumes has more disks, in the
# kernel's order, not the command line's.
root=
i=0
while [ -z "$root" ]; do
  for b in /sys/block/vd*; do
    [ "$(cat "$b/serial" 2>/dev/null)" = "${ROOT_SERIAL}" ] && root="/dev/\${b##*/}"
  done
  i=$((i + 1)); [ $i -gt 400 ] && fail "the root disk (serial ${ROOT_SERIAL}) never appeared"
  [ -z "$root" ] && sleep 0.05
done
mount -t ext4 -o rw,noatime,noinit_itable "$root" /newroot || fail "cannot mount $root"
mkdir -p /newroot/opt/bothy /newroot/dev /newroot/proc /newroot/sys
mount -t tmpfs -o mode=0755,size=8m bothy-agent /newroot/opt/bothy || fail "cannot mount /opt/bothy"
cp /bothy/agent.mjs /bothy/bothy-helper /bothy/pid1.sh /newroot/opt/bothy/ && cp /bin/busybox /newroot/opt/bothy/busybox || fail "cannot copy the agent"
mount -o remount,ro /newroot/opt/bothy
port=
i=0
while [ -z "$port" ]; do
  for p in /sys/class/virtio-ports/*; do
    [ "$(cat "$p/name" 2>/dev/null)" = "${AGENT_PORT_NAME}" ] && port="/dev/\${p##*/}"
  done
  i=$((i + 1)); [ $i -gt 400 ] && fail "the agent port ${AGENT_PORT_NAME} never appeared"
  [ -z "$port" ] && sleep 0.05
done
mount --move /dev /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
exec switch_root /newroot /opt/bothy/busybox sh /opt/bothy/pid1.sh "$port"
`;

/** At most this many processes (threads included) run under a VM guest's commands until the host's `limits` say otherwise. */
export const GUEST_MAX_PROCESSES = 1024;

export const PID1_SCRIPT = `# bothy PID 1 inside the guest: see packages/server/src/images/guest-init.ts
bb=/opt/bothy/busybox
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
$bb mkdir -p /dev/pts /dev/shm /tmp
$bb mount -t devpts -o gid=5,mode=620 devpts /dev/pts
$bb mount -t tmpfs -o mode=1777 shm /dev/shm
$bb ln -sf /proc/self/fd /dev/fd 2>/dev/null
# Loopback, with or without a network: servers inside are reached on 127.0.0.1 (also by the host's port proxy).
$bb ip link set lo up
# Commands run in a cgroup that caps their processes (a fork bomb gets EAGAIN, not the VM); the
# agent stays outside it, and the OOM killer never picks the agent.
cg=/sys/fs/cgroup
if $bb mount -t cgroup2 none $cg 2>/dev/null && echo +pids > $cg/cgroup.subtree_control && $bb mkdir -p $cg/commands && echo ${GUEST_MAX_PROCESSES} > $cg/commands/pids.max; then
  # Commands get a small CPU share beside the agent, so a busy guest still answers its host.
  echo +cpu > $cg/cgroup.subtree_control 2>/dev/null && echo 10 > $cg/commands/cpu.weight
  export BOTHY_COMMANDS_CGROUP=$cg/commands
else
  echo "bothy: no pids cgroup in this kernel; commands have no process limit" >/dev/console
fi
BOTHY_CHANNEL="$1" /usr/bin/node /opt/bothy/agent.mjs </dev/null >/dev/console 2>&1 &
agent=$!
echo -1000 > /proc/$agent/oom_score_adj
unset BOTHY_COMMANDS_CGROUP
# A blocking wait also reaps orphans re-parented to PID 1; loop until the agent itself is gone.
while $bb kill -0 $agent 2>/dev/null; do wait; done
echo "bothy: the agent ended; powering off" >/dev/console
$bb sync
$bb reboot -f
`;
