/**
 * Real template builds: debootstrap, apt and chroot against a Debian mirror, as root. The store
 * is the persistent test cache (BOTHY_TEST_TEMPLATES_DIR), so seed and code-runtime are built
 * once per machine; the failure and abort cases use throwaway templates that are never kept.
 */
import { execFile, execFileSync } from "node:child_process";
import { cp, lstat, mkdir, mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mountsUnder, removeTree } from "../src/images/template-builder.ts";
import { TemplateStore, type BuildProgress } from "../src/images/template-store.ts";
import { testTemplatesDir } from "../../../test/paths.ts";

const exec = promisify(execFile);
const repoTemplates = fileURLToPath(new URL("../../../templates/", import.meta.url));

function missingRequirement(): string | undefined {
  if (process.getuid?.() !== 0) return "needs root (debootstrap, mount, chroot)";
  for (const tool of ["debootstrap", "chroot", "mount"]) {
    try {
      execFileSync("sh", ["-c", 'command -v "$1"', "sh", tool], { stdio: "ignore" });
    } catch {
      return `needs ${tool} on PATH`;
    }
  }
  return undefined;
}
const missing = missingRequirement();
if (missing !== undefined) console.warn(`template-build tests skipped: ${missing}`);

async function inChroot(rootfs: string, ...cmd: string[]): Promise<string> {
  const { stdout } = await exec("chroot", [rootfs, ...cmd], { env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" } });
  return stdout.trim();
}

/** Runs `fn` on a read-only overlay of a child template's layers: its whole tree. */
async function withMerged<T>(layers: string[], fn: (tree: string) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(path.join(tmpdir(), "bothy-merged-"));
  await exec("mount", ["-t", "overlay", "overlay", "-o", `ro,lowerdir=${layers.join(":")}`, dir]);
  try {
    return await fn(dir);
  } finally {
    await exec("umount", [dir]);
    await rm(dir, { recursive: true });
  }
}

describe.skipIf(missing !== undefined)(`template builds (${missing ?? "root, debootstrap, network"})`, () => {
  const storeDir = testTemplatesDir();
  let sourceDir: string;
  let store: TemplateStore;

  const leftovers = async (name: string): Promise<string[]> =>
    (await readdir(path.join(storeDir, ".tmp")).catch(() => [])).filter((e) => e.startsWith(`${name}.`));
  const realStore = async (): Promise<string> => (await exec("realpath", [storeDir])).stdout.trim();

  beforeAll(async () => {
    // Throwaway templates sit beside copies of the real ones; a copy hashes the same, so the
    // real ones stay cached.
    sourceDir = await mkdtemp(path.join(tmpdir(), "bothy-templates-"));
    for (const name of ["seed", "code-runtime"])
      await cp(path.join(repoTemplates, name), path.join(sourceDir, name), { recursive: true });
    const define = async (name: string, yaml: string): Promise<void> => {
      await mkdir(path.join(sourceDir, name));
      await writeFile(path.join(sourceDir, name, "template.yaml"), yaml);
    };
    await define("test-fail", "from: seed\ncommands: [echo about to fail, exit 3]\n");
    await define("test-abort", "from: seed\ncommands: [sleep 120]\n");
    await define("test-abort-base", "base: debian/bookworm\npackages: [bash]\n");
    await define(
      "test-shared",
      "from: seed\nfiles: [{ src: note, dest: /etc/bothy/note, mode: 0600 }]\ncommands: [test -f /etc/bothy/note]\n",
    );
    await writeFile(path.join(sourceDir, "test-shared", "note"), "shared\n");
    store = new TemplateStore({ sourceDir, storeDir });
  });

  afterAll(async () => {
    await rm(sourceDir, { recursive: true, force: true });
    await removeTree(path.join(storeDir, "test-shared"));
    // test-shared's layers, which no build names any more.
    await store.removeOrphanLayers();
  });

  it("builds seed with node, bash, /workspace and /opt/bothy", { timeout: 600_000 }, async () => {
    const seed = await store.build("seed");
    for (const p of ["usr/bin/node", "bin/bash", "etc/ssl/certs/ca-certificates.crt"])
      await stat(path.join(seed.rootfs, p));
    expect((await stat(path.join(seed.rootfs, "workspace"))).mode & 0o7777).toBe(0o755);
    expect((await stat(path.join(seed.rootfs, "opt/bothy"))).isDirectory()).toBe(true);
    expect(await readdir(path.join(seed.rootfs, "opt/bothy"))).toEqual([]);
    expect(await inChroot(seed.rootfs, "node", "-e", "console.log(1)")).toBe("1");
    expect((await readdir(path.join(seed.rootfs, "var/cache/apt/archives"))).filter((f) => f.endsWith(".deb"))).toEqual(
      [],
    );
    expect((await readdir(path.join(seed.rootfs, "var/lib/apt/lists"))).filter((f) => f !== "partial")).toEqual([]);
    expect(seed.env).toMatchObject({ LANG: "C.UTF-8" });
    // A base template is one layer: its whole tree.
    expect(seed.layers).toEqual([seed.rootfs]);
    expect(path.dirname(path.dirname(seed.rootfs))).toBe(path.join(storeDir, "layers"));
    expect(await store.resolve("seed")).toEqual(seed);
  });

  it("returns the cached build on a second call without rebuilding", async () => {
    const first = await store.build("seed");
    const events: BuildProgress[] = [];
    const started = performance.now();
    const again = await store.build("seed", { onProgress: (ev) => events.push(ev) });
    const ms = performance.now() - started;
    console.info(`cached build of seed: ${ms.toFixed(0)} ms`);
    expect(again).toEqual(first);
    expect(events).toEqual([]);
    expect(ms).toBeLessThan(2_000);
  });

  it("builds code-runtime from seed with python, git, curl and npm", { timeout: 900_000 }, async () => {
    const titles = new Set<string>();
    const started = performance.now();
    const runtime = await store.build("code-runtime", { onProgress: (ev) => titles.add(ev.title) });
    console.info(
      `build of code-runtime: ${((performance.now() - started) / 1000).toFixed(1)} s (${titles.size > 0 ? "built" : "cached"})`,
    );
    // Its layer over seed's: the whole tree is the two mounted together.
    expect(runtime.layers.slice(1)).toEqual((await store.resolve("seed"))?.layers);
    await withMerged(runtime.layers, async (tree) => {
      expect(await inChroot(tree, "python3", "--version")).toMatch(/^Python 3\./);
      expect(await inChroot(tree, "git", "--version")).toMatch(/^git version/);
      expect(await inChroot(tree, "curl", "--version")).toMatch(/^curl /);
      expect(await inChroot(tree, "npm", "--version")).toMatch(/^\d+\.\d+/);
      expect(await inChroot(tree, "node", "-e", "console.log(1)")).toBe("1");
    });
    expect(runtime.env["PIP_BREAK_SYSTEM_PACKAGES"]).toBe("1");
  });

  it("removes the tree of a failing build and reports the command's output", { timeout: 300_000 }, async () => {
    const lines: string[] = [];
    const failing = store.build("test-fail", { onProgress: (ev) => ev.line !== undefined && lines.push(ev.line) });
    await expect(failing).rejects.toThrow(
      /failed at step 2\/4 \(commands\): chroot .* exited with code 3; last output:\n\$ echo about to fail\nabout to fail\n\$ exit 3$/,
    );
    await expect(failing).rejects.toMatchObject({ code: "template_build_failed" });
    expect(lines).toContain("$ exit 3");
    expect(await leftovers("test-fail")).toEqual([]);
    expect(await mountsUnder(await realStore())).toEqual([]);
    expect(await store.resolve("test-fail")).toBeUndefined();
  });

  it("stops an aborted build while commands run, unmounts, and removes its tree", { timeout: 300_000 }, async () => {
    const controller = new AbortController();
    const reason = new Error("test abort");
    const started = store.build("test-abort", {
      signal: controller.signal,
      onProgress: (ev) => ev.line === "$ sleep 120" && setTimeout(() => controller.abort(reason), 500),
    });
    await expect(started).rejects.toBe(reason);
    expect(await leftovers("test-abort")).toEqual([]);
    expect(await mountsUnder(await realStore())).toEqual([]);
    expect((await lstat("/dev/null")).isCharacterDevice()).toBe(true);
  });

  it("stops an aborted debootstrap, unmounts what it mounted, and removes its tree", { timeout: 300_000 }, async () => {
    const controller = new AbortController();
    // By the time dpkg unpacks, debootstrap has mounted /proc and /sys in the target.
    const started = store.build("test-abort-base", {
      signal: controller.signal,
      onProgress: (ev) =>
        ev.line?.startsWith("I: Unpacking") === true && controller.abort(new Error("abort debootstrap")),
    });
    await expect(started).rejects.toThrow("abort debootstrap");
    expect(await leftovers("test-abort-base")).toEqual([]);
    expect(await mountsUnder(await realStore())).toEqual([]);
    expect((await lstat("/dev/null")).isCharacterDevice()).toBe(true);
  });

  it("shares one build between concurrent callers and copies files with their mode", { timeout: 300_000 }, async () => {
    const finals = [0, 0];
    const [a, b] = await Promise.all(
      [0, 1].map((i) =>
        store.build("test-shared", {
          force: true,
          onProgress: (ev) => ev.title === "finalize" && (finals[i] = (finals[i] ?? 0) + 1),
        }),
      ),
    );
    expect(a).toEqual(b);
    expect(finals).toEqual([1, 1]);
    const note = await stat(path.join(a?.rootfs ?? "", "etc/bothy/note"));
    expect(note.mode & 0o7777).toBe(0o600);
    expect(await readdir(path.join(storeDir, "test-shared"))).toEqual([a?.hash]);
  });

  it("waits for a live lock holder and breaks a stale lock", { timeout: 300_000 }, async () => {
    const lock = path.join(storeDir, ".locks", "test-shared.lock");
    const stat22 = (pid: number | string): string => {
      const s = execFileSync("cat", [`/proc/${pid}/stat`], { encoding: "utf8" });
      return s.slice(s.lastIndexOf(")") + 2).split(" ")[19] ?? "";
    };
    // A lock of a process that has exited: broken at once.
    const dead = await new Promise<number>((resolve) => {
      const child = execFile("true", () => resolve(child.pid ?? 0));
    });
    await writeFile(lock, JSON.stringify({ pid: dead, start: "1" }));
    await store.build("test-shared", { force: true });

    // A lock of a live process (this one, as another process would hold it): the build waits.
    await writeFile(lock, JSON.stringify({ pid: process.pid, start: stat22(process.pid) }));
    const waited: string[] = [];
    const build = store.build("test-shared", {
      force: true,
      onProgress: (ev) => ev.title === "waiting" && waited.push(ev.line ?? ""),
    });
    await new Promise((r) => setTimeout(r, 1_500));
    expect(waited).toEqual([`another build of "test-shared" is running (pid ${process.pid})`]);
    await rm(lock);
    await build;
    await expect(stat(lock)).rejects.toMatchObject({ code: "ENOENT" });
  });
});
