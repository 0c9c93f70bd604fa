import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { closeSync, openSync, readSync, writeFileSync } from "node:fs";
import type { ParsedHostFrame } from "@bothy/protocol";
import { agentEnv } from "./agent-env.ts";

type IdentityFrame = Extract<ParsedHostFrame, { t: "identity" }>;

const BASE_ENV = {
  PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
  HOME: "/root",
  TERM: "xterm",
  LANG: "C.UTF-8",
};

/** Runs the guest helper (VM guests only); rejects with what it printed on failure. */
export function runHelper(args: string[], input?: Buffer, timeoutMs = 10_000): Promise<void> {
  return new Promise((resolve, reject) => {
    const helper = agentEnv().helper;
    const child = execFile(helper, args, { timeout: timeoutMs }, (err, _out, stderr) =>
      err ? reject(new Error(`${helper} ${args[0] ?? ""}: ${String(stderr).trim() || err.message}`)) : resolve(),
    );
    child.stdin?.end(input);
  });
}

/** Bytes straight from the kernel RNG, never from a generator whose state a snapshot copied. */
export function kernelRandomBytes(n: number): Buffer {
  const buf = Buffer.alloc(n);
  const fd = openSync("/dev/urandom", "r");
  try {
    readSync(fd, buf, 0, n, null);
  } finally {
    closeSync(fd);
  }
  return buf;
}

/**
 * Replaces Math.random with xorshift128+ seeded from the kernel: V8's own state was captured in
 * the snapshot and would give every clone the same sequence.
 */
function reseedMathRandom(): void {
  const seed = kernelRandomBytes(16);
  let s0 = seed.readBigUInt64LE(0) | 1n;
  let s1 = seed.readBigUInt64LE(8);
  const mask = (1n << 64n) - 1n;
  Math.random = () => {
    let x = s0;
    const y = s1;
    s0 = y;
    x = (x ^ (x << 23n)) & mask;
    s1 = x ^ y ^ (x >> 17n) ^ (y >> 26n);
    return Number(((s1 + y) & mask) >> 11n) / 2 ** 53;
  };
}

/**
 * Makes this guest the sandbox the host says it is: kernel RNG reseeded with the host's bytes
 * (credited and forced, so clones of one snapshot diverge at once), clock set, hostname set,
 * in-process generators reseeded, and the environment commands get. Returns that environment.
 */
export async function applyIdentity(frame: IdentityFrame, entropy: Buffer): Promise<NodeJS.ProcessEnv> {
  if (entropy.length < 32)
    throw new Error(`identity carried ${entropy.length} bytes of entropy; at least 32 are needed`);
  await runHelper(
    ["identity", String(Math.floor(frame.time_ms / 1000)), String((frame.time_ms % 1000) * 1_000_000)],
    entropy,
  );
  writeFileSync("/proc/sys/kernel/hostname", frame.hostname);
  writeMachineId(frame.sandbox_id);
  reseedMathRandom();
  return { ...BASE_ENV, ...frame.env, HOSTNAME: frame.hostname, BOTHY_SANDBOX_ID: frame.sandbox_id };
}

/**
 * `/etc/machine-id`, 32 hex digits of the sandbox's own: stable across its wakes, different in
 * each sandbox, so sandboxes started from one snapshot (which holds its source's) differ; derived
 * as the host derives a gVisor sandbox's (server drivers/oci-spec.ts `machineIdOf`). A root file
 * system the guest cannot write keeps the template's.
 */
function writeMachineId(sandboxId: string): void {
  const id = createHash("sha256").update(`bothy-machine-id:${sandboxId}`).digest("hex").slice(0, 32);
  try {
    writeFileSync("/etc/machine-id", `${id}\n`, { mode: 0o444 });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EROFS") throw err;
  }
}
