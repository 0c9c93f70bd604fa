/**
 * The pieces of QEMU's disk chain that need no mount: a layer's changes written into a tree that
 * holds its parent's (apply-layer.ts), and a changed image frozen as a qcow2 member that keeps
 * only the clusters that differ from its backing (disk-chain.ts `freezeDelta`, real qemu-img).
 */
import { execFile } from "node:child_process";
import { lstat, mkdir, mkdtemp, readFile, readdir, readlink, rm, symlink, writeFile, open } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { applyLayer } from "../src/images/apply-layer.ts";
import { freezeDelta } from "../src/images/disk-chain.ts";

const exec = promisify(execFile);

describe("QEMU disk chain", () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(path.join(tmpdir(), "bothy-disk-chain-"));
  });
  afterEach(() => rm(dir, { recursive: true, force: true }));

  /** Files under `root` as `path=content` (directories as `path/`, links as `path->target`), sorted. */
  const listing = async (root: string, rel = ""): Promise<string[]> => {
    const out: string[] = [];
    for (const name of await readdir(path.join(root, rel))) {
      const r = rel ? `${rel}/${name}` : name;
      const st = await lstat(path.join(root, r));
      if (st.isDirectory()) out.push(`${r}/`, ...(await listing(root, r)));
      else if (st.isSymbolicLink()) out.push(`${r}->${await readlink(path.join(root, r))}`);
      else out.push(`${r}=${await readFile(path.join(root, r), "utf8")}`);
    }
    return out.sort();
  };
  const put = async (root: string, files: Record<string, string>): Promise<void> => {
    for (const [rel, content] of Object.entries(files)) {
      await mkdir(path.dirname(path.join(root, rel)), { recursive: true });
      await writeFile(path.join(root, rel), content);
    }
  };

  it("writes a layer's changes, removals and replaced directories into its parent's tree", async () => {
    const [upper, merged, target] = ["upper", "merged", "target"].map((d) => path.join(dir, d)) as [
      string,
      string,
      string,
    ];
    // The parent's tree, as the child's disk holds it before the layer is applied.
    await put(target, { "etc/keep": "p", "etc/change": "p", "etc/remove": "p", "etc/dir/old": "p", "was-file": "p" });
    await mkdir(path.join(target, "usr/lib/deep"), { recursive: true });
    await symlink("/etc", path.join(target, "link-to-dir"));
    // The layer's upper: a change, an addition, a replaced directory, a file turned directory and
    // a link turned directory. A whiteout (a 0/0 device in a real upper) is any entry the merged
    // view does not show: here a plain file stands in for it.
    await put(upper, {
      "etc/change": "c",
      "etc/added": "c",
      "etc/remove": "",
      "etc/dir/new": "c",
      "was-file/inside": "c",
      "link-to-dir/x": "c",
    });
    // The chain's merged view: what the child's tree is, wherever the upper touches it.
    await put(merged, {
      "etc/keep": "p",
      "etc/change": "c",
      "etc/added": "c",
      "etc/dir/new": "c",
      "was-file/inside": "c",
      "link-to-dir/x": "c",
    });
    await mkdir(path.join(merged, "usr/lib/deep"), { recursive: true });

    await applyLayer(upper, merged, target);
    expect(await listing(target)).toEqual(await listing(merged));
  });

  it("freezes a changed disk as a qcow2 over its parent holding only the clusters that differ", async () => {
    const parent = path.join(dir, "parent.raw");
    const changed = path.join(dir, "changed.raw");
    const member = path.join(dir, "member.qcow2");
    const MIB = 1024 * 1024;
    const bytes = Buffer.alloc(32 * MIB, 0x5a);
    await writeFile(parent, bytes);
    await writeFile(changed, bytes);
    // One 4 KiB block changed in the middle, and 1 MiB more past the parent's end.
    const f = await open(changed, "r+");
    await f.write(Buffer.alloc(4096, 0x01), 0, 4096, 16 * MIB);
    await f.write(Buffer.alloc(MIB, 0x02), 0, MIB, 32 * MIB);
    await f.close();

    await freezeDelta({ path: changed, format: "raw" }, { path: parent, format: "raw", bytes: 32 * MIB }, member);
    const info = JSON.parse((await exec("qemu-img", ["info", "--output=json", member])).stdout) as {
      "virtual-size": number;
      "actual-size": number;
      "backing-filename": string;
    };
    expect(info["virtual-size"]).toBe(33 * MIB);
    // Named relative to the member's folder, so the chain moves with its store.
    expect(info["backing-filename"]).toBe("parent.raw");
    // What differs (a cluster and the 1 MiB) and qcow2's tables, not the parent's 32 MiB.
    expect(info["actual-size"]).toBeLessThan(2 * MIB);
    await exec("qemu-img", ["compare", "-f", "qcow2", "-F", "raw", member, changed]);
    expect((await lstat(member)).mode & 0o777).toBe(0o444);
  });
});
