/**
 * A gVisor sandbox's files as a snapshot takes them: the upper directory of its root overlay (what
 * it wrote over its template: files, whiteouts for what it removed, opaque directories), copied
 * with `cp -a` (device nodes, xattrs and owners kept) into a new directory the layer store then
 * publishes. A running sandbox is frozen (`runsc pause`, which this runsc does on ptrace in ~25 ms
 * here) for the copy only and thawed in a `finally`; its guest's `sync` comes before, from the
 * caller, which holds the agent. A stopped sandbox's disk is mounted read-only for the copy.
 *
 * What runsc and the agent put in the upper themselves is left out: the mount points runsc made
 * for bothy's bind mounts (`/opt/bothy/*`, `/etc/ld.so.preload`, `/etc/machine-id`) and the
 * agent's runtime directory (`/run/bothy`). A sandbox started from the snapshot gets them again.
 *
 * A server that dies while a sandbox is frozen leaves it paused: the capture's marker
 * (capture-freeze.ts) tells the next server's take-over (`thawAfterCrash`) to resume it; the
 * half-made copy in staging is the snapshot store's orphan sweep's.
 */
import { existsSync } from "node:fs";
import { mkdir, readFile, rm, rmdir } from "node:fs/promises";
import { join } from "node:path";
import { run } from "../util/host-command.ts";
import { clearFrozen, frozenByCapture, holdForTest, markFrozen } from "./capture-freeze.ts";
import { RUNSC_TIMEOUT_MS, type Runsc } from "./runsc.ts";

/** Paths (relative to the root) of bothy's own in the upper, never part of a snapshot. */
export const NOT_SNAPSHOTTED = ["opt/bothy", "etc/ld.so.preload", "etc/machine-id", "run/bothy"] as const;

const MOUNT_TIMEOUT_MS = 10_000;
/** A copy of many GiB takes minutes on a slow disk; past this the capture fails (and thaws). */
const COPY_TIMEOUT_MS = 30 * 60_000;

/** The sandbox directory's layout (gvisor-driver.ts): the upper lives on `disk/` when it has a disk image. */
function layout(dir: string): { image: string | undefined; base: string } {
  const image = join(dir, "disk.ext4");
  return existsSync(image) ? { image, base: join(dir, "disk") } : { image: undefined, base: dir };
}

/**
 * Copies sandbox `id`'s upper directory to `dest` (which must not exist). `running`: its container
 * runs now and is frozen for the copy; else its disk is mounted read-only beside it for the copy.
 * Returns how long the sandbox was frozen (ms; 0 when it did not run).
 */
export async function captureUpper(
  runsc: Runsc,
  sandbox: { id: string; dir: string; running: boolean },
  dest: string,
): Promise<{ frozenMs: number }> {
  const { image, base } = layout(sandbox.dir);
  let frozenMs = 0;
  if (sandbox.running) {
    await markFrozen(sandbox.dir);
    await run(runsc.path, runsc.args("pause", sandbox.id), { timeoutMs: RUNSC_TIMEOUT_MS });
    const t0 = performance.now();
    try {
      await copyTree(join(base, "upper"), dest);
      await holdForTest();
    } finally {
      frozenMs = Math.round(performance.now() - t0);
      await run(runsc.path, runsc.args("resume", sandbox.id), { timeoutMs: RUNSC_TIMEOUT_MS });
      await clearFrozen(sandbox.dir);
    }
  } else if (image !== undefined && !(await mounted(base))) {
    // Beside the sandbox's own mount point, so the driver's sweep of its mounts would see it. Never
    // a second mount of an image still mounted (a release that failed): that one is read in place.
    const mnt = join(sandbox.dir, "snapshot-mnt");
    await mkdir(mnt, { recursive: true });
    try {
      await run("mount", ["-o", "loop,ro,nosuid,nodev,noexec", image, mnt], { timeoutMs: MOUNT_TIMEOUT_MS });
      try {
        await copyTree(join(mnt, "upper"), dest);
      } finally {
        await run("umount", [mnt], { timeoutMs: MOUNT_TIMEOUT_MS });
      }
    } finally {
      await rmdir(mnt);
    }
  } else {
    await copyTree(join(base, "upper"), dest);
  }
  await Promise.all(NOT_SNAPSHOTTED.map((p) => rm(join(dest, p), { recursive: true, force: true })));
  return { frozenMs };
}

/**
 * Before a take-over: resumes sandbox `id` if a capture froze it and its server died before the
 * thaw (its marker is there and runsc reports it paused). True when it resumed one.
 */
export async function thawAfterCrash(runsc: Runsc, id: string, dir: string): Promise<boolean> {
  if (!frozenByCapture(dir)) return false;
  const paused = (await runsc.status(id)) === "paused";
  if (paused) await run(runsc.path, runsc.args("resume", id), { timeoutMs: RUNSC_TIMEOUT_MS });
  await clearFrozen(dir);
  return paused;
}

/** Whether `target` is a mount point now. */
async function mounted(target: string): Promise<boolean> {
  return (await readFile("/proc/self/mounts", "utf8"))
    .split("\n")
    .some((line) => line.split(" ")[1]?.replace(/\\040/g, " ") === target);
}

async function copyTree(from: string, to: string): Promise<void> {
  await run("cp", ["-a", "--", from, to], { timeoutMs: COPY_TIMEOUT_MS });
}
