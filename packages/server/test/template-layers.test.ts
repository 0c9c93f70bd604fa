/**
 * Templates as layers (issue 27 item 5), with real builds (debootstrap, chroot, overlayfs) and
 * real sandboxes: a tiny parent over seed and a child that changes one file, removes one, adds
 * one and replaces a directory. The child's layer holds only that (whiteouts for what it
 * removed), sandboxes of each see their own tree, a sandbox's writes never reach a layer, and a
 * layer no build names is removed when a server starts. One server and one sandbox per template
 * and driver; the driver matters (gVisor mounts the chain; QEMU's disks are a qcow2 chain that
 * follows it, each child's image holding only the clusters its layer changed).
 */
import { execFile, execFileSync } from "node:child_process";
import { cp, lstat, mkdir, mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Sandbox } from "@bothy/sdk";
import { TemplateStore, type BuiltTemplate } from "../src/images/template-store.ts";
import { ensureDiskImage } from "../src/images/disk-chain.ts";
import { driverTitle, testDriver, testDrivers } from "./helpers/drivers.ts";
import { noLeaks } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";
import { testTemplatesDir } from "../../../test/paths.ts";

const exec = promisify(execFile);
const repoTemplates = fileURLToPath(new URL("../../../templates/", import.meta.url));
const drivers = testDrivers();
const qemu = testDriver("qemu");

function missingRequirement(): string | undefined {
  if (process.getuid?.() !== 0) return "needs root (debootstrap, mount, chroot)";
  for (const tool of ["debootstrap", "chroot", "mount", "python3"]) {
    try {
      execFileSync("sh", ["-c", 'command -v "$1"', "sh", tool], { stdio: "ignore" });
    } catch {
      return `needs ${tool} on PATH`;
    }
  }
  return undefined;
}
const missing = missingRequirement();

const PARENT = [
  "from: seed",
  "commands:",
  "  - mkdir -p /etc/layers/dir",
  "  - echo parent > /etc/layers/keep",
  "  - echo parent > /etc/layers/change",
  "  - echo parent > /etc/layers/remove",
  "  - echo parent > /etc/layers/dir/old",
  "",
].join("\n");
const CHILD = [
  "from: layers-parent",
  "commands:",
  "  - echo child > /etc/layers/change",
  "  - rm /etc/layers/remove",
  "  - echo child > /etc/layers/added",
  // A directory removed and made again: overlayfs marks it opaque, so the parent's files are gone.
  "  - rm -r /etc/layers/dir && mkdir /etc/layers/dir && echo child > /etc/layers/dir/new",
  "",
].join("\n");

/** `du -s` in bytes, not crossing into mounts. */
async function du(dir: string): Promise<number> {
  return Number((await exec("du", ["-s", "-x", "-B1", dir])).stdout.split(/\s/)[0]);
}

describe.skipIf(missing !== undefined)(`templates as layers (${missing ?? "root, debootstrap, overlayfs"})`, () => {
  const storeDir = testTemplatesDir();
  let sourceDir: string;
  let store: TemplateStore;
  let parent: BuiltTemplate;
  let child: BuiltTemplate;
  let orphan: string;
  let ts: TestServer;

  beforeAll(async () => {
    // seed is a copy of the real one (it hashes the same, so the cached build is used).
    sourceDir = await mkdtemp(path.join(tmpdir(), "bothy-layers-"));
    await cp(path.join(repoTemplates, "seed"), path.join(sourceDir, "seed"), { recursive: true });
    for (const [name, yaml] of [
      ["layers-parent", PARENT],
      ["layers-child", CHILD],
    ] as const) {
      await mkdir(path.join(sourceDir, name));
      await writeFile(path.join(sourceDir, name, "template.yaml"), yaml);
    }
    store = new TemplateStore({ sourceDir, storeDir });
    parent = await store.build("layers-parent");
    child = await store.build("layers-child");
    // A layer no build names, as a crashed build or a replaced one leaves it.
    const tree = path.join(storeDir, ".tmp", "orphan-tree");
    await rm(tree, { recursive: true, force: true });
    await mkdir(path.join(tree, "etc"), { recursive: true });
    await writeFile(path.join(tree, "etc", "orphan"), "x");
    orphan = (await store.layers.locked(new AbortController().signal, () => store.layers.publish(tree, null, "orphan")))
      .id;
    ts = await startTestServer({}, store);
  }, 1_800_000);

  afterAll(async () => {
    await rm(sourceDir, { recursive: true, force: true });
    if (ts !== undefined) expect(await ts.stop()).toEqual(noLeaks());
  });

  it("stores only what the child adds: its changes and whiteouts, over its parent's chain", async () => {
    expect(child.layers.slice(1)).toEqual(parent.layers);
    expect(parent.layers.length).toBe(2);
    expect(child.layers[0]).toBe(child.rootfs);
    const own = path.join(child.rootfs, "etc/layers");
    expect(await readFile(path.join(own, "change"), "utf8")).toBe("child\n");
    expect(await readFile(path.join(own, "added"), "utf8")).toBe("child\n");
    // Unchanged files are not in the child's layer at all.
    await expect(lstat(path.join(own, "keep"))).rejects.toMatchObject({ code: "ENOENT" });
    await expect(lstat(path.join(child.rootfs, "usr/bin/node"))).rejects.toMatchObject({ code: "ENOENT" });
    // A removed file is a whiteout (a 0/0 character device); a replaced directory is opaque.
    const whiteout = await lstat(path.join(own, "remove"));
    expect([whiteout.isCharacterDevice(), whiteout.rdev]).toEqual([true, 0]);
    // Node has no xattr call; Python's os.getxattr reads the trusted namespace as root.
    const xattr = "import os, sys; sys.stdout.write(os.getxattr(sys.argv[1], 'trusted.overlay.opaque').decode())";
    const opaque = await exec("python3", ["-c", xattr, path.join(own, "dir")]);
    expect(opaque.stdout).toBe("y");
    expect(await readdir(path.join(own, "dir"))).toEqual(["new"]);
    // The child's layer against its parent's whole tree: a few KiB against hundreds of MB.
    const childBytes = await du(child.rootfs);
    const parentBytes = (await Promise.all(parent.layers.map(du))).reduce((a, b) => a + b, 0);
    console.info(`layers: child ${childBytes} B, parent chain ${parentBytes} B`);
    expect(childBytes * 1000).toBeLessThan(parentBytes);
  });

  it("a layer no build names is gone once a server has started over the store; every named chain is kept", () => {
    // The store is the tests' shared template cache: a server of another test file running at the
    // same time sweeps it too and may remove the orphan before this server's start does, so which
    // server removed it is not asserted (removeOrphans itself: layer-store.unit.test.ts).
    return Promise.all([
      expect(lstat(path.join(store.layers.dir, orphan))).rejects.toMatchObject({ code: "ENOENT" }),
      ...child.layers.map(async (tree) => expect((await lstat(tree)).isDirectory()).toBe(true)),
    ]);
  });

  it.skipIf(qemu.missing !== undefined)(
    driverTitle(qemu, "stores a child's QEMU disk as a qcow2 over its parent's, holding only what its layer changed"),
    { timeout: 600_000 },
    async () => {
      const info = async (file: string): Promise<{ "actual-size": number; "backing-filename"?: string }> =>
        JSON.parse((await exec("qemu-img", ["info", "--output=json", "-U", file])).stdout) as {
          "actual-size": number;
          "backing-filename"?: string;
        };
      const childDisk = await ensureDiskImage(child.rootfs);
      const parentDisk = await ensureDiskImage(parent.rootfs);
      const seedDisk = await ensureDiskImage(parent.layers.at(-1) ?? "");
      expect([seedDisk.format, parentDisk.format, childDisk.format]).toEqual(["raw", "qcow2", "qcow2"]);
      // Each image is its layer's, in its layer's folder (swept with it), read-only, backed by its parent's.
      for (const [disk, tree] of [
        [childDisk, child.rootfs],
        [parentDisk, parent.rootfs],
      ] as const)
        expect(path.dirname(disk.path)).toBe(path.dirname(tree));
      const childInfo = await info(childDisk.path);
      const parentInfo = await info(parentDisk.path);
      const seedInfo = await info(seedDisk.path);
      expect(path.resolve(path.dirname(childDisk.path), childInfo["backing-filename"] ?? "")).toBe(parentDisk.path);
      expect(path.resolve(path.dirname(parentDisk.path), parentInfo["backing-filename"] ?? "")).toBe(seedDisk.path);
      expect((await lstat(childDisk.path)).mode & 0o222).toBe(0);
      // The child's own image against the whole tree's: a few clusters against hundreds of MB.
      console.info(
        `QEMU disks: child ${childInfo["actual-size"]} B, parent ${parentInfo["actual-size"]} B, seed ${seedInfo["actual-size"]} B`,
      );
      expect(childInfo["actual-size"] * 20).toBeLessThan(seedInfo["actual-size"]);
      expect(childDisk.bytes).toBeGreaterThanOrEqual(parentDisk.bytes);
    },
  );

  describe.each(drivers)("$name", (d) => {
    it.skipIf(d.missing !== undefined)(
      driverTitle(d, "a sandbox sees its template's whole tree, and its writes never reach a layer"),
      { timeout: 600_000 },
      async () => {
        const made: Sandbox[] = [];
        try {
          const create = async (template: string): Promise<Sandbox> => {
            const box = await Sandbox.create({ baseUrl: ts.url, template, driver: d.name, memoryMib: 512 });
            made.push(box);
            return box;
          };
          const sh = async (box: Sandbox, cmd: string): Promise<string> => (await box.commands.run(cmd)).stdout.trim();
          const list =
            "for f in keep change remove added; do printf '%s=' $f; cat /etc/layers/$f 2>/dev/null || echo -; done; ls /etc/layers/dir";
          const kid = await create("layers-child");
          expect(await sh(kid, list)).toBe("keep=parent\nchange=child\nremove=-\nadded=child\nnew");
          expect(await sh(kid, "node -e 'console.log(1)'")).toBe("1");
          // A sandbox's code changes and removes files of every layer: only its own upper changes.
          await sh(kid, "echo mine > /etc/layers/keep; rm -f /etc/layers/change /usr/bin/node; rm -r /etc/layers/dir");
          expect(await sh(kid, "cat /etc/layers/keep; ls /usr/bin/node 2>/dev/null || echo gone")).toBe("mine\ngone");

          const old = await create("layers-parent");
          expect(await sh(old, list)).toBe("keep=parent\nchange=parent\nremove=parent\nadded=-\nold");
          const again = await create("layers-child");
          expect(await sh(again, list)).toBe("keep=parent\nchange=child\nremove=-\nadded=child\nnew");
          expect(await sh(again, "node -e 'console.log(2)'")).toBe("2");
          expect(await readFile(path.join(parent.rootfs, "etc/layers/keep"), "utf8")).toBe("parent\n");
          expect(await readFile(path.join(child.rootfs, "etc/layers/change"), "utf8")).toBe("child\n");
        } finally {
          for (const box of made) await box.kill();
        }
      },
    );
  });
});
