import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { LayerStore, lowerDirsOf, MAX_CHAIN_LENGTH } from "../src/images/layer-store.ts";

describe("layer store", () => {
  let dir: string;
  let store: LayerStore;
  const signal = new AbortController().signal;
  let n = 0;

  /** A tree in the store's own temp area (publish renames, so it must be on the same file system). */
  const tree = async (file: string): Promise<string> => {
    const t = path.join(dir, ".tmp", `t${n++}`);
    await mkdir(t, { recursive: true });
    await writeFile(path.join(t, file), file);
    return t;
  };
  const publish = async (parent: string | null, prefix = "test"): Promise<string> =>
    (await store.locked(signal, async () => store.publish(await tree(prefix), parent, prefix))).id;

  beforeEach(async () => {
    dir = await mkdtemp(path.join(tmpdir(), "bothy-layers-"));
    store = new LayerStore(dir);
  });
  afterEach(() => rm(dir, { recursive: true, force: true }));

  it("reads a chain top first, as overlayfs's lowerdir wants it, from any layer's tree", async () => {
    const base = await publish(null, "seed");
    const mid = await publish(base, "code-runtime");
    const top = await publish(mid, "fullstack");
    expect(top).toMatch(/^fullstack-[0-9a-f]{16}$/);
    expect((await store.chain(top)).map((l) => l.id)).toEqual([top, mid, base]);
    expect(await lowerDirsOf(store.treeOf(top))).toEqual([top, mid, base].map((id) => store.treeOf(id)));
    // A directory that is not a layer is a whole tree by itself.
    expect(await lowerDirsOf(path.join(dir, "old", "rootfs"))).toEqual([path.join(dir, "old", "rootfs")]);
  });

  it("moves files beside the tree into the layer's folder with it (a VM snapshot's disk and memory)", async () => {
    const base = await publish(null, "seed");
    const files = path.join(dir, ".tmp", "files");
    await mkdir(files, { recursive: true });
    await writeFile(path.join(files, "tree.qcow2"), "disk");
    await writeFile(path.join(files, "memory.state"), "memory");
    const layer = await store.locked(signal, async () =>
      store.publish(await tree("snap"), base, "snap", undefined, [
        path.join(files, "tree.qcow2"),
        path.join(files, "memory.state"),
      ]),
    );
    expect((await readdir(path.join(store.dir, layer.id))).sort()).toEqual([
      "layer.json",
      "memory.state",
      "tree",
      "tree.qcow2",
    ]);
    expect(await readdir(files)).toEqual([]);
  });

  it("refuses a parent that is missing and a chain longer than overlayfs can mount", async () => {
    await expect(publish("gone-0123456789abcdef")).rejects.toThrow("parent layer gone-0123456789abcdef is missing");
    let id = await publish(null);
    for (let i = 0; i < MAX_CHAIN_LENGTH; i++) id = await publish(id);
    await expect(store.chain(id)).rejects.toThrow(`more than ${MAX_CHAIN_LENGTH} ancestors`);
  });

  it("removes layers outside the roots' chains and staging left by a crash, keeping every ancestor", async () => {
    const base = await publish(null, "seed");
    const kept = await publish(base, "child");
    const orphan = await publish(base, "replaced");
    const orphanChild = await publish(orphan, "snap");
    await mkdir(path.join(store.dir, ".new-crashed-0123456789abcdef"));
    // Not a layer's name: left alone.
    await mkdir(path.join(store.dir, "README"));
    const removed = await store.removeOrphans(async () => [kept], signal);
    expect(removed.sort()).toEqual([orphan, orphanChild].sort());
    expect((await readdir(store.dir)).sort()).toEqual(["README", base, kept].sort());
    expect(await store.removeOrphans(async () => [kept], signal)).toEqual([]);
  });

  it("chains a layer over a parent in another store (a snapshot over a template), each store sweeping its own", async () => {
    const base = await publish(null, "seed");
    const snaps = new LayerStore(path.join(dir, "home", "snapshots"));
    const snapTree = async (): Promise<string> => {
      const t = path.join(dir, "home", "snapshots", ".staging", `s${n++}`);
      await mkdir(t, { recursive: true });
      return t;
    };
    const snap = await snaps.locked(signal, async () => snaps.publish(await snapTree(), base, "snap", store));
    const over = await snaps.locked(signal, async () => snaps.publish(await snapTree(), snap.id, "snap", snaps));
    expect(snap.parentDir).toBe(store.dir);
    // A parent in the same store is named without a store.
    expect(over.parentDir).toBeUndefined();
    expect(await lowerDirsOf(snaps.treeOf(over.id))).toEqual([
      snaps.treeOf(over.id),
      snaps.treeOf(snap.id),
      store.treeOf(base),
    ]);
    await expect(
      snaps.locked(signal, async () => snaps.publish(await snapTree(), "gone-0123456789abcdef", "snap", store)),
    ).rejects.toThrow("parent layer gone-0123456789abcdef is missing");
    // The snapshot store keeps the chain of its roots within itself and never touches the template's.
    expect(await snaps.removeOrphans(async () => [over.id], signal)).toEqual([]);
    expect((await snaps.removeOrphans(async () => [], signal)).sort()).toEqual([snap.id, over.id].sort());
    expect(await readdir(store.dir)).toEqual([base]);
  });

  it("removes a layer's QEMU disk image with the layer, and keeps a kept layer's", async () => {
    const base = await publish(null, "seed");
    const kept = await publish(base, "child");
    const orphan = await publish(base, "replaced");
    // Each image lives in its layer's folder, beside the tree (images/disk-chain.ts).
    await writeFile(path.join(store.dir, base, "tree.fit.ext4"), "raw");
    await writeFile(path.join(store.dir, kept, "tree.qcow2"), "qcow2 over ../seed-…/tree.fit.ext4");
    await writeFile(path.join(store.dir, orphan, "tree.qcow2"), "qcow2 over ../seed-…/tree.fit.ext4");
    expect(await store.removeOrphans(async () => [kept], signal)).toEqual([orphan]);
    expect((await readdir(path.join(store.dir, kept))).sort()).toEqual(["layer.json", "tree", "tree.qcow2"]);
    expect((await readdir(path.join(store.dir, base))).sort()).toEqual(["layer.json", "tree", "tree.fit.ext4"]);
  });
});
