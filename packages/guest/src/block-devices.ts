import { readdirSync, readFileSync } from "node:fs";

/** The serial the host gives a VM's root disk (qemu-process.ts), by which its initramfs finds it. */
export const ROOT_SERIAL = "bothy-root";

/**
 * The VM guest's virtio disk whose serial the host set to `serial` (`/dev/vdX`), or undefined.
 * Disks are found by serial, never by name: the order in which virtio devices appear is the
 * kernel's, and the host decides which disk carries what.
 */
export function diskBySerial(serial: string): string | undefined {
  let names: string[];
  try {
    names = readdirSync("/sys/block");
  } catch {
    return undefined; // no sysfs: not a VM guest
  }
  for (const name of names) {
    if (!name.startsWith("vd")) continue;
    try {
      if (readFileSync(`/sys/block/${name}/serial`, "utf8").trim() === serial) return `/dev/${name}`;
    } catch {
      // a disk without a serial attribute is none of the host's
    }
  }
  return undefined;
}
