/**
 * A template's root tree as a read-only ext4 image, the bottom of every QEMU sandbox's disk
 * chain. It sits beside the tree it was made from (`<store>/<name>/<hash>/rootfs.fit.ext4`),
 * so it shares the build's content hash and goes away with it. Trees are immutable once built,
 * so an image that exists is never stale. The image is fitted to its tree (a little room for
 * metadata and slack); each sandbox's disk is that image grown by the sandbox's `disk_mib`.
 *
 * QEMU sandboxes use it for base layers (and builds from before layers): a child layer's disk is
 * a qcow2 of its own changes over its parent's (disk-chain.ts). Given a child's tree, it makes the
 * whole tree's image from a read-only overlay of the chain (bench/disk-chain.ts compares the two).
 */
import { existsSync } from "node:fs";
import { chmod, mkdir, mkdtemp, rename, rm } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { run } from "../util/host-command.ts";
import { TemplateError } from "../errors/internal-errors.ts";
import { lowerDirsOf } from "./layer-store.ts";

const MIB = 1024 * 1024;
/** Beyond the tree's blocks: the journal, group descriptors, bitmaps and a little free space. */
const IMAGE_ROOM_BYTES = 96 * MIB;
/** mkfs.ext4's default ratio, given explicitly so small images do not get the "small" layout (1 KiB blocks). */
const BYTES_PER_INODE = 16384;
/** Image sizes are a multiple of this; sandbox disks grow from there in whole MiB. */
const IMAGE_ALIGN_BYTES = 64 * MIB;

const inflight = new Map<string, Promise<string>>();

/** The ext4 image of `rootfs` (a built template's tree), made on first use. */
export function ensureExt4Image(rootfs: string): Promise<string> {
  const image = join(dirname(rootfs), `${basename(rootfs)}.fit.ext4`);
  if (existsSync(image)) return Promise.resolve(image);
  let job = inflight.get(image);
  if (job === undefined) {
    job = build(rootfs, image).finally(() => inflight.delete(image));
    inflight.set(image, job);
  }
  return job;
}

async function build(rootfs: string, image: string): Promise<string> {
  // Built in a temp dir beside the target and renamed in: a present image is always whole, and
  // two servers building at once both end with a good one.
  const work = await mkdtemp(join(dirname(image), ".ext4-"));
  const tmp = join(work, "image.ext4");
  const merged = join(work, "merged");
  let mounted = false;
  try {
    const lowers = await lowerDirsOf(rootfs);
    let source = rootfs;
    if (lowers.length > 1) {
      // Lower directories only, no upper: a read-only mount of the merged tree.
      await mkdir(merged);
      await run("mount", ["-t", "overlay", "overlay", "-o", `ro,lowerdir=${lowers.join(":")}`, merged]);
      mounted = true;
      source = merged;
    }
    await run("truncate", ["-s", String(await fittedBytes(source)), tmp], { timeoutMs: 10_000 });
    // Inode tables and journal are left to be zero (the file is sparse) instead of written, so
    // the image holds just the tree; the guest mounts with noinit_itable for the same reason.
    // 4 KiB blocks and the default inode ratio whatever the size, so a grown disk is laid out
    // like one made at its full size.
    const args = [
      "-q",
      "-F",
      "-L",
      "bothy-root",
      "-m",
      "0",
      "-b",
      "4096",
      "-i",
      String(BYTES_PER_INODE),
      "-E",
      "lazy_itable_init=1,lazy_journal_init=1",
      "-d",
      source,
      tmp,
    ];
    await run("mkfs.ext4", args, { timeoutMs: 300_000 });
    await chmod(tmp, 0o444);
    await rename(tmp, image);
  } catch (err) {
    throw new TemplateError(`Making the ext4 image of ${rootfs} failed: is e2fsprogs installed?`, { cause: err });
  } finally {
    // Unmounted before anything deletes the work dir, or the delete would reach the layers.
    if (mounted) await run("umount", [merged]);
    await rm(work, { recursive: true, force: true });
  }
  return image;
}

/** An image size that holds the tree's blocks and, at the inode ratio, its files, with room to spare. */
async function fittedBytes(tree: string): Promise<number> {
  const du = async (args: string[]): Promise<number> =>
    Number((await run("du", ["-s", "-x", ...args, tree], { timeoutMs: 300_000 })).stdout.split(/\s/)[0]);
  const used = await du(["-B1"]);
  const inodes = await du(["--inodes"]);
  const bytes = Math.max(used * 1.1, inodes * BYTES_PER_INODE * 1.25) + IMAGE_ROOM_BYTES;
  return Math.ceil(bytes / IMAGE_ALIGN_BYTES) * IMAGE_ALIGN_BYTES;
}
