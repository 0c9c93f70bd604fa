/**
 * Read-only filesystem layers: `<storeDir>/layers/<id>/{tree/,layer.json}`. A layer's tree is an
 * overlayfs upper directory (the files it adds or changes, a 0/0 character device for each file
 * it removes, `trusted.overlay.opaque` on each directory it replaces) and names its parent, so a
 * chain of layers mounted as overlayfs lower directories (top first) is the whole tree. A base
 * layer (parent null) is a whole tree by itself. A layer's parent may lie in another store
 * (`parentDir`): snapshots keep their layers in the server's home, over templates' layers that may
 * live in a directory other servers share.
 *
 * Layers are immutable once published and never rewritten: a rebuild publishes a new layer (a
 * new id), so a layer mounted under a running sandbox never changes beneath it. What names
 * layers (a template's build, a snapshot) is the owner's business; the store only keeps
 * the chains of the roots it is given, and the ones mounted right now, when it removes orphans.
 */
import { randomBytes } from "node:crypto";
import { mkdir, readFile, readdir, rename, writeFile } from "node:fs/promises";
import path from "node:path";
import { z } from "zod";
import { run } from "../util/host-command.ts";
import { acquireLock } from "./template-lock.ts";

export interface Layer {
  id: string;
  /** The layer this one lies over; null for a base layer (a whole tree). */
  parent: string | null;
  /** The `layers` directory of the store holding `parent`, when that is another store (a snapshot over a template). */
  parentDir?: string;
  /** The layer's own tree (not the merged view); read-only. */
  tree: string;
}

/** Ids are file names: a prefix saying what made the layer, then hex. */
export const LAYER_ID_RE = /^[a-z0-9-]{1,40}-[0-9a-f]{8,64}$/;

/**
 * Overlayfs takes every lower directory in one mount option, which the kernel caps at a page
 * (4096 bytes); paths of ~90 characters leave room for ~40 layers. 6.1's own limit is 500.
 */
export const MAX_CHAIN_LENGTH = 32;

const layerMeta = z.object({
  id: z.string().regex(LAYER_ID_RE),
  parent: z.string().regex(LAYER_ID_RE).nullable(),
  parentDir: z.string().startsWith("/").optional(),
  createdAt: z.string(),
});

export class LayerStore {
  /** `<storeDir>/layers`. */
  readonly dir: string;
  private readonly lockFile: string;

  constructor(storeDir: string) {
    this.dir = path.join(path.resolve(storeDir), "layers");
    this.lockFile = path.join(path.resolve(storeDir), ".locks", "layers.lock");
  }

  treeOf(id: string): string {
    return path.join(this.dir, checkId(id), "tree");
  }

  /** The layer, or undefined when it is not on disk. */
  async read(id: string): Promise<Layer | undefined> {
    let text: string;
    try {
      text = await readFile(path.join(this.dir, checkId(id), "layer.json"), "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw err;
    }
    const meta = layerMeta.parse(JSON.parse(text));
    return {
      id: meta.id,
      parent: meta.parent,
      ...(meta.parentDir === undefined ? {} : { parentDir: meta.parentDir }),
      tree: this.treeOf(meta.id),
    };
  }

  /** `id` and its ancestors, top first: the order of overlayfs's `lowerdir=`. */
  async chain(id: string): Promise<Layer[]> {
    const out: Layer[] = [];
    // The store the next layer is in: this one, until a layer names its parent's elsewhere.
    let elsewhere: LayerStore | undefined;
    for (let next: string | null = id; next !== null;) {
      if (out.length >= MAX_CHAIN_LENGTH)
        throw new Error(`layer ${id} has more than ${MAX_CHAIN_LENGTH} ancestors; overlayfs cannot mount it`);
      const store = elsewhere ?? this;
      const layer = await store.read(next);
      if (layer === undefined) throw new Error(`layer ${next} (in the chain of ${id}) is missing from ${store.dir}`);
      out.push(layer);
      if (layer.parentDir !== undefined) elsewhere = new LayerStore(path.dirname(layer.parentDir));
      next = layer.parent;
    }
    return out;
  }

  /**
   * Makes `tree` (a directory on the store's file system, which nothing writes any more) a new
   * layer over `parent`: renamed into place, never copied. Whiteouts and xattrs stay as they are.
   * Call it inside `locked`, with whatever names the layer written before the lock is released,
   * or a concurrent orphan sweep may take it. `parentStore`: where `parent` lies when it is not in
   * this store (a snapshot's layer over its template's); that store's own sweep must then be told
   * to keep it. `beside`: files moved into the layer's folder next to its tree (a VM snapshot's
   * disk member and memory), renamed in with it.
   */
  async publish(
    tree: string,
    parent: string | null,
    prefix: string,
    parentStore?: LayerStore,
    beside: readonly string[] = [],
  ): Promise<Layer> {
    const id = `${prefix}-${randomBytes(8).toString("hex")}`;
    checkId(id);
    const elsewhere = parentStore !== undefined && parentStore.dir !== this.dir ? parentStore.dir : undefined;
    if (parent !== null && (await (parentStore ?? this).read(parent)) === undefined)
      throw new Error(`parent layer ${parent} is missing`);
    await mkdir(this.dir, { recursive: true });
    // Assembled in a temp dir beside the final one and renamed: a layer dir is always whole.
    const staging = path.join(this.dir, `.new-${id}`);
    await mkdir(staging, { mode: 0o755 });
    await rename(tree, path.join(staging, "tree"));
    for (const file of beside) await rename(file, path.join(staging, path.basename(file)));
    const meta: z.infer<typeof layerMeta> = {
      id,
      parent,
      ...(elsewhere === undefined || parent === null ? {} : { parentDir: elsewhere }),
      createdAt: new Date().toISOString(),
    };
    await writeFile(path.join(staging, "layer.json"), `${JSON.stringify(meta, null, 2)}\n`);
    await rename(staging, path.join(this.dir, id));
    return {
      id,
      parent,
      ...(meta.parentDir === undefined ? {} : { parentDir: meta.parentDir }),
      tree: this.treeOf(id),
    };
  }

  /** Runs `fn` holding the store's lock, which publishing and the orphan sweep share across processes. */
  async locked<T>(signal: AbortSignal, fn: () => Promise<T>): Promise<T> {
    await mkdir(path.dirname(this.lockFile), { recursive: true });
    const release = await acquireLock(this.lockFile, signal, () => undefined);
    try {
      return await fn();
    } finally {
      await release();
    }
  }

  /**
   * Removes every layer that is neither in the chain of one of `roots()` nor a lower directory of
   * an overlay mounted now (a sandbox started from a build since replaced), and staging dirs a
   * crashed publish left. `roots` is read under the lock, so a build publishing at the same time
   * is either seen whole or not started. Returns the ids removed.
   */
  async removeOrphans(roots: () => Promise<Iterable<string>>, signal: AbortSignal): Promise<string[]> {
    return this.locked(signal, async () => {
      let entries: string[];
      try {
        entries = await readdir(this.dir);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === "ENOENT") return [];
        throw err;
      }
      const keep = new Set<string>();
      const mounted = await mountedLowerDirs();
      for (const entry of entries) {
        if (LAYER_ID_RE.test(entry) && mounted.has(this.treeOf(entry))) keep.add(entry);
      }
      for (const root of [...(await roots()), ...keep]) {
        for (let next: string | null = root; next !== null && LAYER_ID_RE.test(next);) {
          keep.add(next);
          const layer = await this.read(next);
          // A parent in another store is that store's to keep.
          next = layer?.parentDir === undefined ? (layer?.parent ?? null) : null;
        }
      }
      const removed: string[] = [];
      for (const entry of entries) {
        if (keep.has(entry)) continue;
        const staging = entry.startsWith(".new-");
        if (!staging && !LAYER_ID_RE.test(entry)) continue;
        await run("rm", ["-rf", "--one-file-system", "--", path.join(this.dir, entry)], { timeoutMs: 10 * 60_000 });
        if (!staging) removed.push(entry);
      }
      return removed;
    });
  }
}

function checkId(id: string): string {
  if (!LAYER_ID_RE.test(id)) throw new Error(`not a layer id: ${JSON.stringify(id)}`);
  return id;
}

/** Every overlayfs lower directory mounted in this mount namespace. */
async function mountedLowerDirs(): Promise<Set<string>> {
  const info = await readFile("/proc/self/mountinfo", "utf8");
  const out = new Set<string>();
  for (const line of info.split("\n")) {
    const [, after] = line.split(" - ");
    if (after === undefined || !after.startsWith("overlay ")) continue;
    const options = after.split(" ")[2] ?? "";
    for (const opt of options.split(",")) {
      if (!opt.startsWith("lowerdir=")) continue;
      for (const dir of opt.slice("lowerdir=".length).split(":")) out.add(decodeMountPath(dir));
    }
  }
  return out;
}

function decodeMountPath(field: string): string {
  return field.replace(/\\([0-7]{3})/g, (_, oct: string) => String.fromCharCode(parseInt(oct, 8)));
}

/**
 * The overlayfs lower directories, top first, of a template root as sandboxes get it: a layer's
 * tree (`<store>/layers/<id>/tree`) stands for its whole chain, read from the layers' own
 * records; any other directory is a whole tree by itself (a build from before layers).
 */
export async function lowerDirsOf(root: string): Promise<string[]> {
  const layerDir = path.dirname(root);
  const layersDir = path.dirname(layerDir);
  const id = path.basename(layerDir);
  if (path.basename(root) !== "tree" || path.basename(layersDir) !== "layers" || !LAYER_ID_RE.test(id)) return [root];
  const store = new LayerStore(path.dirname(layersDir));
  if ((await store.read(id)) === undefined) return [root];
  return (await store.chain(id)).map((l) => l.tree);
}
