/**
 * The QEMU part of bench/start: create → first `echo ok` through bothy with a cold boot per
 * sandbox and with warm start (restore from the template's memory snapshot), against the raw
 * floor: plain QEMU with the same kernel, flags and busybox, whose init echoes `ok` on the serial
 * console. The raw VM has no disk, no agent and no Node, so it is what the hardware and emulator
 * cost before bothy adds anything.
 */
import { spawn } from "node:child_process";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { hardwareVirtualization } from "../packages/server/src/drivers/qemu-driver.ts";
import { hostCpuKhz } from "../packages/server/src/drivers/qemu-process.ts";
import { cpioNewc } from "../packages/server/src/images/cpio-newc.ts";
import { BUSYBOX_PATH } from "../packages/server/src/images/initramfs.ts";
import { ensureKernel } from "../packages/server/src/images/kernel.ts";
import { startTestServer } from "../packages/server/test/helpers/test-server.ts";
import { testKernelDir } from "../test/paths.ts";
import { median, secs, stopAndInspect, summary, timedRun, withTimeout, type RunTimes } from "./bench-util.ts";

export interface QemuFigures {
  cold: RunTimes[];
  warm: RunTimes[];
  raw: number[];
}

type Attempt = <T>(label: string, i: number, fn: () => Promise<T>) => Promise<T | undefined>;

export async function qemuSeries(
  runs: number,
  warmup: number,
  scratch: string,
  attempt: Attempt,
  leaks: string[],
): Promise<QemuFigures> {
  const cold = await bothySeries("qemu cold", { BOTHY_QEMU_WARM: "0" }, runs, warmup, attempt, leaks);
  const warm = await bothySeries("qemu warm", { BOTHY_QEMU_WARM: "1" }, runs, warmup, attempt, leaks);
  const raw: number[] = [];
  const initrd = await rawInitramfs(scratch);
  for (let i = 0; i < runs + warmup; i++) {
    const t = await attempt("qemu raw", i, () => rawBoot(initrd));
    if (t !== undefined && i >= warmup) raw.push(t);
  }
  return { cold, warm, raw };
}

async function bothySeries(
  label: string,
  env: Record<string, string>,
  runs: number,
  warmup: number,
  attempt: Attempt,
  leaks: string[],
): Promise<RunTimes[]> {
  const ts = await startTestServer({ BOTHY_DRIVER: "qemu", BOTHY_POOL_SIZE: "0", ...env });
  const times: RunTimes[] = [];
  try {
    // The first create of a warm series makes the template's snapshot: that is the warm-up.
    for (let i = 0; i < runs + warmup; i++) {
      const t = await attempt(label, i, () => timedRun(ts.url, ts.wsUrl));
      if (t && i >= warmup) times.push(t);
    }
  } finally {
    const found = await stopAndInspect(ts, "bench-start-qemu");
    leaks.push(...found.leaks.map((l) => `${label}: ${l}`));
  }
  console.log(`# ${label}: done, create → first command median ${secs(median(times.map((t) => t.create + t.exec)))}`);
  return times;
}

async function rawInitramfs(scratch: string): Promise<string> {
  const init = "#!/bin/sh\nmount -t devtmpfs devtmpfs /dev\necho ok > /dev/ttyS0\nreboot -f\n";
  const archive = cpioNewc([
    { type: "dir", path: "bin" },
    { type: "file", path: "bin/busybox", data: await readFile(BUSYBOX_PATH), mode: 0o755 },
    ...["sh", "mount", "echo", "reboot"].map((a) => ({
      type: "symlink" as const,
      path: `bin/${a}`,
      target: "busybox",
    })),
    { type: "dir", path: "dev" },
    { type: "file", path: "init", data: Buffer.from(init), mode: 0o755 },
  ]);
  const path = join(scratch, "raw-initramfs.cpio.gz");
  await writeFile(path, gzipSync(archive));
  return path;
}

/** Spawn of QEMU to `ok` on its serial console, with the driver's machine flags. */
async function rawBoot(initrd: string): Promise<number> {
  const kernel = await ensureKernel(testKernelDir());
  const kvm = await hardwareVirtualization();
  const args = [
    "-M",
    "microvm",
    "-accel",
    kvm ? "kvm" : "tcg,tb-size=16",
    "-cpu",
    kvm ? "host" : "max",
    "-smp",
    "1",
    "-m",
    "512M",
    "-nodefaults",
    "-no-user-config",
    "-display",
    "none",
    "-no-reboot",
    "-kernel",
    kernel.vmlinuz,
    "-initrd",
    initrd,
    "-append",
    `console=ttyS0 quiet panic=-1 tsc_early_khz=${await hostCpuKhz()}`,
    "-serial",
    "stdio",
  ];
  const t0 = performance.now();
  const child = spawn("qemu-system-x86_64", args, { stdio: ["ignore", "pipe", "pipe"] });
  try {
    return await withTimeout(
      new Promise<number>((resolve, reject) => {
        let out = "";
        child.stdout.setEncoding("utf8").on("data", (s: string) => {
          out += s;
          if (/(^|\n)ok\r?\n/.test(out)) resolve(performance.now() - t0);
        });
        child.once("exit", (code) => reject(new Error(`raw qemu exited (${code}) before ok: ${out.slice(-300)}`)));
      }),
      "raw qemu boot",
    );
  } finally {
    if (child.exitCode === null) child.kill("SIGKILL");
  }
}

export function reportQemu(q: QemuFigures): void {
  const first = (xs: RunTimes[]): number[] => xs.map((t) => t.create + t.exec);
  const raw = median(q.raw);
  console.log("");
  console.log(`(e) qemu cold boot → first command: median ${secs(median(first(q.cold)))}`);
  console.log(`    create  ${summary(q.cold.map((t) => t.create))}`);
  console.log(`(f) qemu warm create (restore) → first command: median ${secs(median(first(q.warm)))}`);
  console.log(`    create  ${summary(q.warm.map((t) => t.create))}`);
  console.log(`(g) raw qemu, same kernel and flags, initramfs echo: median ${secs(raw)}  ${summary(q.raw)}`);
  console.log(
    `(h) qemu cold / raw = ${(median(first(q.cold)) / raw).toFixed(2)}, warm / raw = ${(median(first(q.warm)) / raw).toFixed(2)}, cold / warm = ${(median(first(q.cold)) / median(first(q.warm))).toFixed(2)}`,
  );
  const creates = (xs: RunTimes[]): number => median(xs.map((t) => t.create));
  console.log(
    `(i) qemu warm create / cold create (boot) = ${(creates(q.warm) / creates(q.cold)).toFixed(3)} (goal <= 0.1)`,
  );
}
