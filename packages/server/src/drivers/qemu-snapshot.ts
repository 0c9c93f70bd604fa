/**
 * A QEMU sandbox's snapshot: its disk overlay frozen into a read-only member of its template's
 * qcow2 chain (`tree.qcow2`, the name a layer's disk has, so `ensureDiskImage` of the snapshot's
 * layer is that member), and with `memory` its memory and devices (`memory.state`, the file a
 * pause writes), beside the snapshot layer's empty tree. `vm-snapshot.json` says what a restore
 * needs to match.
 *
 * The copy is taken with the VM stopped, not by a QMP block job: `stop` drains and flushes every
 * disk (qcow2's metadata included), so the overlay file at rest is the guest's disk at that
 * instant, and the overlay holds only what the sandbox wrote since its template, so the copy is
 * short (bench/snapshot). A `drive-backup sync=top` job would copy the same bytes while the guest
 * runs, but its copy-before-write slows the guest's writes for the job's length and, for a memory
 * snapshot, the disk must match the saved memory at one instant anyway. With memory, the save is
 * the pause's (`saveVm`: stop, migrate to a file); after it QEMU is in `postmigrate` with its
 * disks inactive, and `cont` takes them back and runs the guest again.
 *
 * The frozen member is made after the thaw: `freezeDelta` rebases the copy onto the image of the
 * layer the snapshot lies over (its template's top, or the snapshot the sandbox started from),
 * keeping only the clusters that differ. A sandbox restored from the warm-start snapshot has its
 * overlay over that snapshot's disk (a cache under qemu/snapshots/, not a layer): its boot's writes
 * land in the member too, and the member never names a file outside the layer chains.
 */
import { chmod, copyFile, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { BothyError } from "@bothy/protocol";
import { z } from "zod";
import { CHILD_IMAGE, freezeDelta, virtualBytes, type DiskImage } from "../images/disk-chain.ts";

/** The snapshot's disk: a chain member, named as a layer's disk is. */
export const SNAPSHOT_DISK = CHILD_IMAGE;
/** The snapshot's memory and devices (a migration stream), when it keeps memory. */
export const SNAPSHOT_MEMORY = "memory.state";
/** What a restore of the snapshot needs to match. */
export const SNAPSHOT_META = "vm-snapshot.json";

const vmSnapshotMeta = z.object({
  memory: z.boolean(),
  /** The VM's machine (qemu-driver.ts `machineKey`): a restore needs the same devices, size and kernel. */
  machine: z.string(),
  vcpu: z.number().int(),
  memoryMib: z.number().int(),
  /** The disk's size: every sandbox started from the snapshot has this one (its room included). */
  diskBytes: z.number().int(),
});
export type VmSnapshotMeta = z.infer<typeof vmSnapshotMeta>;

/** The VM snapshot a template root stands for, when it is a QEMU snapshot's layer; else undefined. */
export async function readVmSnapshot(root: string): Promise<VmSnapshotMeta | undefined> {
  let text: string;
  try {
    text = await readFile(path.join(path.dirname(root), SNAPSHOT_META), "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
  return vmSnapshotMeta.parse(JSON.parse(text));
}

/** The files of a QEMU snapshot's layer folder, beside its tree. */
export function vmSnapshotFiles(root: string): { disk: string; memory: string } {
  const dir = path.dirname(root);
  return { disk: path.join(dir, SNAPSHOT_DISK), memory: path.join(dir, SNAPSHOT_MEMORY) };
}

/** The running VM as a capture sees it (qemu-sandbox.ts). */
export interface FreezableVm {
  /** Runs `copy` with the VM stopped (after saving its memory to `memoryTo`, if given), then runs it again. */
  frozen<T>(copy: () => Promise<T>, memoryTo?: string): Promise<{ value: T; frozenMs: number }>;
  readonly machine: { key: string; vcpu: number; memoryMib: number; volumes: number };
}

/**
 * Writes sandbox `dir`'s snapshot into `out` (an existing directory): the frozen disk, the memory
 * when asked, and the meta. `vm`: it runs now (a memory snapshot needs that); else its disk is at
 * rest and copied as it is.
 */
export async function captureVm(opts: {
  dir: string;
  vm: FreezableVm | undefined;
  base: DiskImage;
  out: string;
  memory: boolean;
}): Promise<{ frozenMs: number; files: string[] }> {
  const { dir, vm, base, out, memory } = opts;
  if (memory && vm === undefined)
    throw new BothyError(
      "sandbox_not_running",
      'A snapshot with "memory": true keeps a running sandbox\'s memory; this one is asleep: send a command to wake it, or leave out "memory" to keep its files.',
    );
  if (memory && vm !== undefined && vm.machine.volumes > 0)
    throw new BothyError(
      "snapshot_memory_unsupported",
      'A QEMU sandbox with volumes cannot keep its memory in a snapshot (the sandboxes started from it get no volume disks, which its memory names); send "memory": false to keep its files.',
    );
  const disk = path.join(dir, "disk.qcow2");
  const copy = path.join(out, ".disk-copy.qcow2");
  const files = { disk: path.join(out, SNAPSHOT_DISK), memory: path.join(out, SNAPSHOT_MEMORY) };
  let frozenMs = 0;
  try {
    if (vm === undefined) await copyFile(disk, copy);
    else ({ frozenMs } = await vm.frozen(() => copyFile(disk, copy), memory ? files.memory : undefined));
    if (memory) await chmod(files.memory, 0o444);
    await freezeDelta({ path: copy, format: "qcow2" }, base, files.disk);
  } finally {
    await rm(copy, { force: true });
  }
  const meta: VmSnapshotMeta = {
    memory,
    machine: vm?.machine.key ?? "",
    vcpu: vm?.machine.vcpu ?? 0,
    memoryMib: vm?.machine.memoryMib ?? 0,
    diskBytes: await virtualBytes(files.disk),
  };
  const metaFile = path.join(out, SNAPSHOT_META);
  await writeFile(metaFile, `${JSON.stringify(meta)}\n`, { mode: 0o444 });
  return { frozenMs, files: memory ? [files.disk, files.memory, metaFile] : [files.disk, metaFile] };
}
