/**
 * bothy's own initramfs for the QEMU driver: busybox-static, the virtio modules of the guest
 * kernel, the init scripts, the guest agent bundle and a small static helper for what Node cannot
 * do (RNG reseed, clock). Cached at `$BOTHY_HOME/initramfs/<hash>.cpio.gz`, keyed by everything
 * that goes in, so a new agent or kernel makes a new one and an unchanged one is reused.
 */
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import { run } from "../util/host-command.ts";
import { cpioNewc, type CpioEntry } from "./cpio-newc.ts";
import { GUEST_MODULES, INIT_APPLETS, INIT_SCRIPT, PID1_SCRIPT } from "./guest-init.ts";
import type { GuestKernel } from "./kernel.ts";
import { TemplateError } from "../errors/internal-errors.ts";

/** The guest helper's C sources, compiled into one static binary. */
export const HELPER_SOURCES = ["bothy-helper.c", "spawner.c"].map((f) =>
  fileURLToPath(new URL(`../../../guest/native/${f}`, import.meta.url)),
);
/** Debian's busybox-static installs here; it must be static, the initramfs has no libc. */
export const BUSYBOX_PATH = "/bin/busybox";

export interface InitramfsInputs {
  home: string;
  kernel: GuestKernel;
  agentPath: string;
  busyboxPath?: string;
  helperSources?: string[];
}

/** Builds (or finds) the initramfs for this kernel and agent; returns its path. */
export async function ensureInitramfs(inputs: InitramfsInputs): Promise<string> {
  const busyboxPath = inputs.busyboxPath ?? BUSYBOX_PATH;
  const helperSources = inputs.helperSources ?? HELPER_SOURCES;
  const [busybox, agent, ...helperC] = await Promise.all([
    readFile(busyboxPath),
    readFile(inputs.agentPath),
    ...helperSources.map((f) => readFile(f)),
  ]).catch((err: unknown) => {
    throw new TemplateError("Cannot build the initramfs: run scripts/install-deps and `npm run build`.", {
      cause: err,
    });
  });
  if (!isStaticElf(busybox))
    throw new TemplateError(`${busyboxPath} is not statically linked: install busybox-static.`);
  const modules = await Promise.all(
    GUEST_MODULES.map(async (m) => ({
      name: m.split("/").pop() ?? m,
      data: await readFile(join(inputs.kernel.modulesDir, m)),
    })),
  );

  const hash = createHash("sha256");
  for (const part of [
    inputs.kernel.release,
    INIT_SCRIPT,
    PID1_SCRIPT,
    busybox,
    agent,
    ...helperC,
    ...modules.map((m) => m.data),
  ])
    hash.update(part).update("\0");
  const key = hash.digest("hex").slice(0, 24);
  const dir = join(inputs.home, "initramfs");
  const out = join(dir, `${key}.cpio.gz`);
  if (existsSync(out)) return out;

  await mkdir(dir, { recursive: true, mode: 0o755 });
  const work = await mkdtemp(join(dir, ".build-"));
  try {
    const helper = await compileHelper(helperSources, work);
    const entries: CpioEntry[] = [
      { type: "dir", path: "bin" },
      { type: "file", path: "bin/busybox", data: busybox, mode: 0o755 },
      ...INIT_APPLETS.map((a): CpioEntry => ({ type: "symlink", path: `bin/${a}`, target: "busybox" })),
      { type: "dir", path: "lib" },
      { type: "dir", path: "lib/modules" },
      ...modules.map((m): CpioEntry => ({ type: "file", path: `lib/modules/${m.name}`, data: m.data })),
      { type: "dir", path: "bothy" },
      { type: "file", path: "bothy/agent.mjs", data: agent },
      { type: "file", path: "bothy/bothy-helper", data: helper, mode: 0o755 },
      { type: "file", path: "bothy/pid1.sh", data: Buffer.from(PID1_SCRIPT) },
      { type: "file", path: "init", data: Buffer.from(INIT_SCRIPT), mode: 0o755 },
    ];
    const tmp = join(work, "initramfs.cpio.gz");
    await writeFile(tmp, gzipSync(cpioNewc(entries), { level: 6 }));
    await rename(tmp, out);
  } finally {
    await rm(work, { recursive: true, force: true });
  }
  return out;
}

async function compileHelper(sources: string[], work: string): Promise<Buffer> {
  const bin = join(work, "bothy-helper");
  try {
    await run("gcc", ["-static", "-Os", "-s", "-Wall", "-o", bin, ...sources], { timeoutMs: 120_000 });
  } catch (err) {
    throw new TemplateError("Compiling the guest helper failed: install gcc and libc6-dev (scripts/install-deps).", {
      cause: err,
    });
  }
  return readFile(bin);
}

/** An ELF executable without a PT_INTERP program header needs no dynamic loader. */
function isStaticElf(buf: Buffer): boolean {
  if (buf.length < 64 || buf.readUInt32BE(0) !== 0x7f454c46 || buf[4] !== 2) return false;
  const phoff = Number(buf.readBigUInt64LE(32));
  const phentsize = buf.readUInt16LE(54);
  const phnum = buf.readUInt16LE(56);
  for (let i = 0; i < phnum; i++) {
    const off = phoff + i * phentsize;
    if (off + 4 > buf.length) return false;
    if (buf.readUInt32LE(off) === 3) return false; // PT_INTERP
  }
  return true;
}
