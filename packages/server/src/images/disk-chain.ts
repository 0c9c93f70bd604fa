/**
 * QEMU's disks as a chain of read-only images that follows the layer chain: a base layer's image
 * is a raw ext4 of its whole tree (ext4-image.ts); a child layer's is a qcow2 backed by its
 * parent's image, holding only the clusters its layer changed (`tree.qcow2` beside the layer's
 * tree, so it lives and is swept with its layer). Each sandbox's disk is a qcow2 over the top of
 * its template's chain. A child's image is made by filling a scratch copy of the parent's disk
 * with the layer's changes (apply-layer.ts) and keeping what differs (`freezeDelta`); building a
 * child never stores its parent again.
 *
 * `freezeDelta` is the general step: any qcow2 whose content is a member's plus changes becomes a
 * read-only member over it. A snapshot of a QEMU sandbox is the same move without the scratch
 * copy: its overlay already holds only its changes over its template's chain.
 */
import { existsSync } from "node:fs";
import { chmod, mkdir, mkdtemp, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import { z } from "zod";
import { TemplateError } from "../errors/internal-errors.ts";
import { run } from "../util/host-command.ts";
import { applyLayer } from "./apply-layer.ts";
import { ensureExt4Image } from "./ext4-image.ts";
import { LayerStore, lowerDirsOf } from "./layer-store.ts";

/** One read-only image of a chain. */
export interface DiskImage {
  path: string;
  format: "raw" | "qcow2";
  /** The disk's size as the guest sees it (a qcow2's virtual size). */
  bytes: number;
}

const MIB = 1024 * 1024;
/** Beyond the child's own files: metadata and slack (its parent's free room is its too). */
const CHILD_ROOM_BYTES = 32 * MIB;
const BYTES_PER_INODE = 16384;
const IMAGE_ALIGN_BYTES = 64 * MIB;
const LONG_MS = 30 * 60_000;
/** The image a child layer's disk is, beside its tree. */
export const CHILD_IMAGE = "tree.qcow2";

const inflight = new Map<string, Promise<DiskImage>>();
const sizes = new Map<string, number>();

/** The disk image of a template root (a layer's tree, or a whole tree from before layers), made on first use. */
export function ensureDiskImage(rootfs: string): Promise<DiskImage> {
  let job = inflight.get(rootfs);
  if (job === undefined) {
    job = diskImage(rootfs).finally(() => inflight.delete(rootfs));
    inflight.set(rootfs, job);
  }
  return job;
}

async function diskImage(rootfs: string): Promise<DiskImage> {
  const parentTree = await parentTreeOf(rootfs);
  if (parentTree === undefined) {
    const image = await ensureExt4Image(rootfs);
    return { path: image, format: "raw", bytes: (await stat(image)).size };
  }
  const parent = await ensureDiskImage(parentTree);
  const image = path.join(path.dirname(rootfs), CHILD_IMAGE);
  if (!existsSync(image)) await buildChild(rootfs, parent, image);
  return { path: image, format: "qcow2", bytes: await virtualBytes(image) };
}

/** The tree of the layer `rootfs`'s layer lies over; undefined for a base layer or a tree that is not a layer. */
async function parentTreeOf(rootfs: string): Promise<string | undefined> {
  const lowers = await lowerDirsOf(rootfs);
  if (lowers.length < 2) return undefined;
  const store = new LayerStore(path.dirname(path.dirname(path.dirname(rootfs))));
  const layer = await store.read(path.basename(path.dirname(rootfs)));
  if (layer?.parent === null || layer?.parent === undefined) return undefined;
  // A snapshot's layer lies over its template's, in another store.
  const parentStore = layer.parentDir === undefined ? store : new LayerStore(path.dirname(layer.parentDir));
  return parentStore.treeOf(layer.parent);
}

/**
 * The child's image: a sparse scratch copy of the parent's disk, grown by what the layer adds,
 * loop-mounted; the layer's changes written in (read from a read-only overlay of the chain); then
 * only the clusters that differ from the parent's disk kept, in a qcow2 over it. Made in the
 * layer's folder under temporary names and renamed in: a present image is always whole.
 */
async function buildChild(rootfs: string, parent: DiskImage, image: string): Promise<void> {
  const layerDir = path.dirname(rootfs);
  const work = await mkdtemp(path.join(layerDir, ".disk-"));
  const scratch = path.join(work, "scratch.raw");
  const mnt = path.join(work, "mnt");
  const merged = path.join(work, "merged");
  // Beside the final name (its backing file is named relative to its folder), its own per build:
  // two servers may build the same image at once, and both end with a whole one.
  const partial = path.join(layerDir, `.${CHILD_IMAGE}${path.basename(work)}.partial`);
  // Undone newest first: the overlay and the scratch mount, then the loop device.
  const undo: Array<() => Promise<unknown>> = [];
  const unwind = async (): Promise<void> => {
    for (let u = undo.at(-1); u !== undefined; u = undo.at(-1)) {
      await u();
      undo.pop();
    }
  };
  let done = false;
  let stuck: unknown;
  try {
    await run("qemu-img", ["convert", "-q", "-f", parent.format, "-O", "raw", parent.path, scratch], {
      timeoutMs: LONG_MS,
    });
    const bytes = align(parent.bytes + (await treeBytes(rootfs)) + CHILD_ROOM_BYTES);
    await run("truncate", ["-s", String(bytes), scratch], { timeoutMs: 10_000 });
    // Offline: the parent's file system is sound (mkfs made it, or this step checked it).
    await run("resize2fs", ["-f", scratch], { timeoutMs: LONG_MS });
    // A loop device of our own, detached (and waited for) before the image is read: the last
    // metadata writes of an unmount must have reached the file.
    const loop = (await run("losetup", ["--find", "--show", scratch], { timeoutMs: 60_000 })).stdout.trim();
    undo.push(() => detachLoop(loop, scratch));
    await mkdir(mnt);
    await mkdir(merged);
    // noinit_itable: the kernel's lazy inode-table zeroing would write blocks no file needs.
    await run("mount", ["-o", "noatime,noinit_itable", loop, mnt], { timeoutMs: 60_000 });
    undo.push(() => run("umount", [mnt], { timeoutMs: 60_000 }));
    const lowers = await lowerDirsOf(rootfs);
    await run("mount", ["-t", "overlay", "overlay", "-o", `ro,lowerdir=${lowers.join(":")}`, merged]);
    undo.push(() => run("umount", [merged], { timeoutMs: 60_000 }));
    await applyLayer(rootfs, merged, mnt);
    await unwind();
    // The child's disk is the parent's for every later build and sandbox: it must be sound.
    await run("e2fsck", ["-f", "-n", scratch], { timeoutMs: LONG_MS });
    await freezeDelta({ path: scratch, format: "raw" }, parent, partial);
    await rename(partial, image);
    done = true;
  } catch (err) {
    throw new TemplateError(`Making the QEMU disk of layer ${path.basename(layerDir)} failed.`, { cause: err });
  } finally {
    // Unmounted before anything deletes the work dir, or the delete would reach the layers; a
    // mount that will not go keeps the work dir too (the error says why).
    stuck = await unwind().then(
      () => undefined,
      (err: unknown) => err,
    );
    if (stuck === undefined) await rm(work, { recursive: true, force: true });
    if (!done) await rm(partial, { force: true });
  }
  // The image is whole, but its work dir still holds a mount: a build that leaves one is an error.
  if (stuck !== undefined) throw new TemplateError(`Unmounting under ${work} failed.`, { cause: stuck });
}

/** Detaches a loop device and waits until the kernel has let go of `file`. */
async function detachLoop(loop: string, file: string): Promise<void> {
  await run("losetup", ["-d", loop], { timeoutMs: 60_000 });
  for (let i = 0; i < 600; i++) {
    if ((await run("losetup", ["-j", file], { timeoutMs: 60_000 })).stdout.trim() === "") return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`the loop device ${loop} still holds ${file}`);
}

/**
 * Makes `out` a read-only qcow2 member of a chain over `backing`, with the content of `changed`
 * (a raw image or a qcow2 that reads as `backing` plus changes) and only the clusters where the
 * two differ: an overlay over `changed`, rebased onto `backing` in qemu-img's safe mode, which
 * compares them cluster by cluster. The backing file is named relative to `out`'s folder, so a
 * chain moves with its store.
 */
export async function freezeDelta(
  changed: Pick<DiskImage, "path" | "format">,
  backing: DiskImage,
  out: string,
): Promise<void> {
  await run("qemu-img", ["create", "-q", "-f", "qcow2", "-F", changed.format, "-b", changed.path, out], {
    timeoutMs: 60_000,
  });
  const relative = path.relative(path.dirname(out), backing.path);
  await run("qemu-img", ["rebase", "-q", "-f", "qcow2", "-F", backing.format, "-b", relative, out], {
    timeoutMs: LONG_MS,
  });
  await chmod(out, 0o444);
}

/** A qcow2's virtual size (the guest's disk), cached: chain members never change. */
export async function virtualBytes(image: string): Promise<number> {
  const known = sizes.get(image);
  if (known !== undefined) return known;
  const { stdout } = await run("qemu-img", ["info", "--output=json", "-U", image], { timeoutMs: 30_000 });
  const bytes = z.object({ "virtual-size": z.number().int() }).parse(JSON.parse(stdout))["virtual-size"];
  sizes.set(image, bytes);
  return bytes;
}

/** What a layer's own tree needs on disk: its blocks, and its files at the inode ratio. */
async function treeBytes(tree: string): Promise<number> {
  const du = async (args: string[]): Promise<number> =>
    Number((await run("du", ["-s", "-x", ...args, tree], { timeoutMs: LONG_MS })).stdout.split(/\s/)[0]);
  return Math.max((await du(["-B1"])) * 1.1, (await du(["--inodes"])) * BYTES_PER_INODE * 1.25);
}

function align(bytes: number): number {
  return Math.ceil(bytes / IMAGE_ALIGN_BYTES) * IMAGE_ALIGN_BYTES;
}
