/**
 * A template's root tree as a read-only ext4 image, the backing file of every QEMU sandbox's
 * qcow2 overlay. It sits beside the tree it was made from (`<store>/<name>/<hash>/rootfs.ext4`),
 * so it shares the build's content hash and goes away with it. Trees are immutable once built,
 * so an image that exists is never stale.
 */
import { existsSync } from "node:fs";
import { chmod, mkdtemp, rename, rm } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { BothyError } from "@bothy/protocol";
import { run } from "../util/host-command.ts";

/** The guest's disk size; the image is sparse, so only the tree's blocks take host space. */
export const ROOT_IMAGE_BYTES = 4 * 1024 * 1024 * 1024;

const inflight = new Map<string, Promise<string>>();

/** The ext4 image of `rootfs` (a built template's tree), made on first use. */
export function ensureExt4Image(rootfs: string): Promise<string> {
  const image = join(dirname(rootfs), `${basename(rootfs)}.ext4`);
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
  try {
    await run("truncate", ["-s", String(ROOT_IMAGE_BYTES), tmp], { timeoutMs: 10_000 });
    // Inode tables and journal are left to be zero (the file is sparse) instead of written, so
    // the image holds just the tree; the guest mounts with noinit_itable for the same reason.
    await run("mkfs.ext4", ["-q", "-F", "-L", "bothy-root", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", "-d", rootfs, tmp], { timeoutMs: 300_000 });
    await chmod(tmp, 0o444);
    await rename(tmp, image);
  } catch (err) {
    throw new BothyError("create_failed", `Making the ext4 image of ${rootfs} failed: ${(err as Error).message}. Is e2fsprogs installed?`, { cause: err });
  } finally {
    await rm(work, { recursive: true, force: true });
  }
  return image;
}
