import { mkdirSync, readFileSync } from "node:fs";
import { execFile } from "node:child_process";
import type { ParsedHostFrame } from "@bothy/protocol";
import { diskBySerial } from "./block-devices.ts";

type VolumesFrame = Extract<ParsedHostFrame, { t: "volumes" }>;

/** The busybox the initramfs copied beside the agent: the guest's `mount`, whatever the template holds. */
const BUSYBOX = "/opt/bothy/busybox";
/** A disk the host attached is there at boot; a moment's grace for the kernel's probe. */
const FIND_TIMEOUT_MS = 10_000;
const MOUNT_TIMEOUT_MS = 30_000;

/**
 * Mounts the VM's volumes, each the disk with the serial the host named, at its path: a reader
 * read-only and without replaying the journal (its disk is read-only: a journal to replay would
 * otherwise refuse the mount), never with set-uid files or device nodes honoured. A path that
 * already has that disk mounted (a guest restored from memory) is left as it is.
 */
export async function mountVolumes(frame: VolumesFrame): Promise<void> {
  for (const m of frame.mounts) {
    const device = await findDisk(m.serial);
    if (mountedAt(device, m.path)) continue;
    mkdirSync(m.path, { recursive: true, mode: 0o755 });
    const options = `${m.read_only ? "ro,noload" : "rw"},nosuid,nodev,noatime`;
    await new Promise<void>((resolve, reject) =>
      execFile(
        BUSYBOX,
        ["mount", "-t", "ext4", "-o", options, device, m.path],
        { timeout: MOUNT_TIMEOUT_MS },
        (err, _out, stderr) =>
          err ? reject(new Error(`mount ${m.path}: ${String(stderr).trim() || err.message}`)) : resolve(),
      ),
    );
  }
}

async function findDisk(serial: string): Promise<string> {
  const deadline = Date.now() + FIND_TIMEOUT_MS;
  for (;;) {
    const device = diskBySerial(serial);
    if (device !== undefined) return device;
    if (Date.now() > deadline) throw new Error(`no disk with serial ${serial} appeared`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Whether /proc/mounts has `device` mounted at `path` (octal escapes as the kernel writes them). */
function mountedAt(device: string, path: string): boolean {
  const escaped = path.replace(/[ \t\n\\]/g, (c) => `\\${c.charCodeAt(0).toString(8).padStart(3, "0")}`);
  return readFileSync("/proc/mounts", "utf8")
    .split("\n")
    .some((line) => {
      const [dev, target] = line.split(" ");
      return dev === device && target === escaped;
    });
}
