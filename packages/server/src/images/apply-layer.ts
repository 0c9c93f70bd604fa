/**
 * Writes a layer's changes into a mounted file system that holds its parent's tree, so it then
 * holds the layer's whole tree. `upper` is the layer's own tree (an overlayfs upper directory:
 * what it adds or changes, whiteouts, opaque directories); `merged` a read-only overlay mount of
 * the layer's whole chain, the truth each change is read from (overlayfs hides its own xattrs
 * there, so none reach the image).
 *
 * Only what the layer touches is visited: each directory the upper has, where an entry the merged
 * view no longer shows is removed (a whiteout, or hidden by an opaque directory), and each file,
 * link or node the upper has, copied whole with `cp -a` (owner, mode, times, xattrs such as file
 * capabilities, and hard links within one batch). Directories the upper has get the merged view's
 * owner, mode and times after their contents are written (xattrs on directories are not copied).
 * What the target holds is read once per directory (a directory made here holds nothing), not
 * looked up per entry: a layer of a few hundred MB has tens of thousands of files.
 */
import type { Dirent } from "node:fs";
import { lchown, lstat, mkdir, readdir, rm, utimes, chmod } from "node:fs/promises";
import { join } from "node:path";
import { run } from "../util/host-command.ts";

/** Paths per `cp` call: far below the kernel's argument limit for paths of ordinary length. */
const COPY_BATCH = 2000;
const COPY_TIMEOUT_MS = 30 * 60_000;

export async function applyLayer(upper: string, merged: string, target: string): Promise<void> {
  const copies: string[] = [];
  const dirs: string[] = [];

  /** `fresh`: the directory was made by this walk, so the target has nothing in it yet. */
  const walk = async (rel: string, fresh: boolean): Promise<void> => {
    const shown = new Set(await readdir(join(merged, rel)));
    const held = new Map<string, Dirent>();
    if (!fresh)
      for (const entry of await readdir(join(target, rel), { withFileTypes: true }))
        if (shown.has(entry.name)) held.set(entry.name, entry);
        else await rm(join(target, rel, entry.name), { recursive: true, force: true });
    for (const entry of await readdir(join(upper, rel), { withFileTypes: true })) {
      const r = rel === "" ? entry.name : `${rel}/${entry.name}`;
      // A whiteout (a 0/0 character device): its name is gone from the merged view, removed above.
      if (!shown.has(entry.name)) continue;
      const dst = join(target, r);
      const have = held.get(entry.name);
      if (entry.isDirectory()) {
        if (have !== undefined && !have.isDirectory()) await rm(dst, { recursive: true, force: true });
        const made = have === undefined || !have.isDirectory();
        if (made) await mkdir(dst);
        dirs.push(r);
        await walk(r, made);
      } else {
        if (have?.isDirectory()) await rm(dst, { recursive: true, force: true });
        copies.push(r);
      }
    }
  };
  await walk("", false);

  for (let i = 0; i < copies.length; i += COPY_BATCH)
    await run(
      "cp",
      ["-a", "--parents", "--remove-destination", "-t", target, "--", ...copies.slice(i, i + COPY_BATCH)],
      { cwd: merged, timeoutMs: COPY_TIMEOUT_MS },
    );

  // Deepest first: writing into a directory changes its times, so each is set after its contents.
  for (const r of dirs.reverse()) {
    const st = await lstat(join(merged, r));
    const dst = join(target, r);
    await lchown(dst, st.uid, st.gid);
    await chmod(dst, st.mode & 0o7777);
    await utimes(dst, st.atime, st.mtime);
  }
}
