/**
 * The guest kernel for the QEMU driver: Debian's cloud kernel, fetched with `apt-get download` and
 * unpacked with `dpkg-deb -x` into `<kernelDir>/<release>/` (default `$BOTHY_HOME/kernel`). It is never installed on the
 * host (that would change the host's boot menu). Unpacked once per release, then cached.
 */
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { run } from "../util/host-command.ts";
import type { Logger } from "../events/server-events.ts";
import { TemplateError } from "../errors/internal-errors.ts";

/** The meta package; it depends on the versioned image of the current ABI. */
export const KERNEL_META_PACKAGE = "linux-image-cloud-amd64";
const RELEASE_RE = /^[0-9][0-9a-z.+-]*-cloud-amd64$/;
const COMPLETE_MARK = ".bothy-complete";

export interface GuestKernel {
  /** e.g. `6.1.0-57-cloud-amd64` */
  release: string;
  vmlinuz: string;
  /** `lib/modules/<release>/kernel` inside the unpacked package. */
  modulesDir: string;
}

/** The versioned package the meta package points at, e.g. `linux-image-6.1.0-57-cloud-amd64`. */
export async function resolveKernelPackage(): Promise<string> {
  const { stdout } = await run("apt-cache", ["depends", "--no-recommends", "--no-suggests", KERNEL_META_PACKAGE], {
    timeoutMs: 30_000,
  });
  const dep = /Depends:\s*(linux-image-[0-9][^\s<>]*-cloud-amd64)/.exec(stdout)?.[1];
  if (dep === undefined)
    throw new Error(`apt-cache shows no versioned image behind ${KERNEL_META_PACKAGE}: ${stdout.trim().slice(0, 300)}`);
  return dep;
}

function kernelAt(dir: string, release: string): GuestKernel {
  return {
    release,
    vmlinuz: join(dir, "boot", `vmlinuz-${release}`),
    modulesDir: join(dir, "lib", "modules", release, "kernel"),
  };
}

/**
 * The unpacked guest kernel, fetched on first use. When apt cannot resolve the package (no lists,
 * offline) a kernel unpacked earlier is used, the newest by name.
 */
export async function ensureKernel(root: string, log: Logger = () => undefined): Promise<GuestKernel> {
  let pkg: string;
  try {
    pkg = await resolveKernelPackage();
  } catch (err) {
    const cached = await cachedReleases(root);
    const newest = cached.at(-1);
    if (newest !== undefined) return kernelAt(join(root, newest), newest);
    throw new TemplateError(`No guest kernel: run \`apt-get update\` so ${KERNEL_META_PACKAGE} can be resolved.`, {
      cause: err,
    });
  }
  const release = pkg.slice("linux-image-".length);
  if (!RELEASE_RE.test(release)) throw new TemplateError(`Unexpected kernel package name ${pkg}.`);
  const dir = join(root, release);
  if (existsSync(join(dir, COMPLETE_MARK))) return kernelAt(dir, release);

  await mkdir(root, { recursive: true, mode: 0o755 });
  const work = await mkdtemp(join(root, `.fetch-${release}-`));
  try {
    log("kernel_fetch", { package: pkg });
    await run("apt-get", ["download", "-q", pkg], { cwd: work, timeoutMs: 300_000 });
    const deb = (await readdir(work)).find((f) => f.endsWith(".deb"));
    if (deb === undefined) throw new Error(`apt-get download ${pkg} left no .deb`);
    const tree = join(work, "tree");
    await run("dpkg-deb", ["-x", join(work, deb), tree], { timeoutMs: 300_000 });
    const k = kernelAt(tree, release);
    if (!existsSync(k.vmlinuz) || !existsSync(k.modulesDir))
      throw new Error(`${pkg} has no boot/vmlinuz-${release} or modules`);
    await writeFile(join(tree, COMPLETE_MARK), `${pkg}\n`);
    // Another server may have unpacked the same release meanwhile: theirs is as good as ours.
    await rename(tree, dir).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== "ENOTEMPTY" && err.code !== "EEXIST") throw err;
    });
  } catch (err) {
    throw new TemplateError(`Fetching the guest kernel ${pkg} failed.`, { cause: err });
  } finally {
    await rm(work, { recursive: true, force: true });
  }
  return kernelAt(dir, release);
}

async function cachedReleases(root: string): Promise<string[]> {
  const entries = await readdir(root).catch(() => [] as string[]);
  return entries.filter((e) => RELEASE_RE.test(e) && existsSync(join(root, e, COMPLETE_MARK))).sort();
}
