/**
 * The host's cgroup layout, found once, and a sandbox's own cgroup on it. Two layouts are
 * supported, decided the way runsc decides: cgroup v2 mounted at /sys/fs/cgroup ("v2", unified),
 * or v1 hierarchies, one per controller under /sys/fs/cgroup, with or without a controller-less
 * cgroup2 beside them ("v1", legacy or hybrid). A sandbox's cgroup is `bothy-<tag>/<id>` in each of
 * them: runsc makes and removes gVisor's itself (the OCI `cgroupsPath`), the QEMU driver makes
 * the VM's here.
 */
import { readFileSync } from "node:fs";
import { mkdir, readFile, rmdir, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { BothyError } from "@bothy/protocol";
import { cgroupPath } from "../util/host-names.ts";
import { NotSupportedError } from "../errors/internal-errors.ts";

export const CGROUP_ROOT = "/sys/fs/cgroup";
/** The controllers a sandbox's limits need: CPU quota, memory limit, process backstop. */
export const LIMIT_CONTROLLERS = ["cpu", "memory", "pids"] as const;
export type LimitController = (typeof LIMIT_CONTROLLERS)[number];

/**
 * Host tasks a sandbox may hold (runsc's sentry and gofer threads, QEMU's threads): a backstop
 * against a runaway on the host side. The process limit proper (`max_processes`) is inside.
 */
export const HOST_PIDS_BACKSTOP = 4096;

/** Set to `off` by an operator who accepts sandboxes without host limits on a host that cannot give them. */
export const HOST_LIMITS_ENV = "BOTHY_HOST_LIMITS";

export type CgroupLayout =
  | { version: 2; root: string; missing: LimitController[] }
  | {
      version: 1;
      /** Where each limit controller's hierarchy is mounted. */
      controllers: Partial<Record<LimitController, string>>;
      /** Every v1 hierarchy (runsc makes a sandbox's cgroup in each it knows). */
      hierarchies: string[];
      /** A controller-less cgroup2 is mounted too (systemd's hybrid layout). */
      hybrid: boolean;
      missing: LimitController[];
    };

export interface CgroupLimits {
  cpuQuotaUs: number;
  cpuPeriodUs: number;
  memoryBytes: number;
  pids: number;
}

interface Mount {
  target: string;
  fstype: string;
  superOptions: string[];
}

/** /proc/self/mountinfo escapes blanks and backslashes in paths as octal. */
const unescape = (s: string): string =>
  s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));

function cgroupMounts(mountinfo: string): Mount[] {
  const out: Mount[] = [];
  for (const line of mountinfo.split("\n")) {
    const [left, right] = line.split(" - ");
    if (left === undefined || right === undefined) continue;
    const target = left.split(" ")[4];
    const [fstype, , options] = right.split(" ");
    if (target === undefined || (fstype !== "cgroup" && fstype !== "cgroup2")) continue;
    out.push({ target: unescape(target), fstype, superOptions: (options ?? "").split(",") });
  }
  return out;
}

/**
 * The layout `mountinfo` describes under `root`. For v2 the controllers come from the root's
 * `cgroup.controllers` (read from disk: a test points `root` at a directory of its own).
 */
export function parseCgroupLayout(mountinfo: string, root: string = CGROUP_ROOT): CgroupLayout {
  const mounts = cgroupMounts(mountinfo);
  if (mounts.some((m) => m.fstype === "cgroup2" && m.target === root)) {
    let available: string[];
    try {
      available = readFileSync(join(root, "cgroup.controllers"), "utf8").trim().split(/\s+/);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
      available = [];
    }
    return { version: 2, root, missing: LIMIT_CONTROLLERS.filter((c) => !available.includes(c)) };
  }
  const v1 = mounts.filter((m) => m.fstype === "cgroup" && m.target.startsWith(`${root}/`));
  const controllers: Partial<Record<LimitController, string>> = {};
  for (const c of LIMIT_CONTROLLERS) {
    const m = v1.find((mount) => mount.superOptions.includes(c));
    if (m) controllers[c] = m.target;
  }
  return {
    version: 1,
    controllers,
    hierarchies: v1.map((m) => m.target),
    hybrid: mounts.some((m) => m.fstype === "cgroup2" && m.target.startsWith(`${root}/`)),
    missing: LIMIT_CONTROLLERS.filter((c) => controllers[c] === undefined),
  };
}

let hostLayout: CgroupLayout | undefined;

/** This host's layout, read once (it does not change while the server runs). */
export async function hostCgroupLayout(): Promise<CgroupLayout> {
  hostLayout ??= parseCgroupLayout(await readFile("/proc/self/mountinfo", "utf8"));
  return hostLayout;
}

/** A few words for logs and `bothy doctor`: the layout and which limit controllers it lacks. */
export function describeLayout(layout: CgroupLayout): string {
  const name =
    layout.version === 2
      ? `cgroup v2 at ${layout.root}`
      : layout.hierarchies.length === 0
        ? "no cgroup hierarchies"
        : `cgroup v1${layout.hybrid ? " (hybrid)" : ""}`;
  return layout.missing.length === 0
    ? `${name} with cpu, memory, pids`
    : `${name} without ${layout.missing.join(", ")}`;
}

/**
 * Why this host cannot limit sandboxes, with the fix, or undefined when it can. An operator who
 * accepts unlimited sandboxes sets BOTHY_HOST_LIMITS=off.
 */
export function limitsProblem(layout: CgroupLayout): string | undefined {
  if (layout.missing.length === 0) return undefined;
  return (
    `This host has ${describeLayout(layout)} (cgroup controllers), so sandbox CPU, memory and process limits ` +
    `cannot be enforced. ` +
    `Fix the host: boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1, Debian 12's default) or mount the ` +
    `cgroup v1 ${layout.missing.join(", ")} hierarchies under ${CGROUP_ROOT}; or set ${HOST_LIMITS_ENV}=off ` +
    `to run sandboxes without host limits.`
  );
}

/** Throws a NotSupportedError (public: `501 not_supported`) with the fix when the host cannot limit sandboxes and the operator did not opt out. */
export function requireHostLimits(layout: CgroupLayout, hostLimits: "required" | "off"): void {
  const problem = limitsProblem(layout);
  if (problem !== undefined && hostLimits === "required") throw new NotSupportedError(problem);
}

/** A sandbox's cgroup, relative to each hierarchy's root: `cgroupPath` (runsc's `cgroupsPath`) without its slash. */
export const sandboxCgroup = (tag: string, id: string): string => cgroupPath(tag, id).slice(1);

/** The sandbox's cgroup directories on this layout, one per limit controller in v1. */
export function sandboxCgroupDirs(layout: CgroupLayout, tag: string, id: string): string[] {
  if (layout.version === 2) return [join(layout.root, sandboxCgroup(tag, id))];
  return layout.hierarchies.map((h) => join(h, sandboxCgroup(tag, id)));
}

/** The kernel's default CPU weight of a cgroup: `cpu.shares` on v1, `cpu.weight` on v2. */
const DEFAULT_CPU_WEIGHT = {
  1: { file: "cpu.shares", value: "1024" },
  2: { file: "cpu.weight", value: "100" },
} as const;

/**
 * Gives the sandbox's cgroup the default CPU weight again (a warm-pool sandbox booted at the
 * lowest one, oci-spec.ts BACKGROUND_CPU_SHARES). Nothing to do where the layout has no cpu controller.
 */
export async function restoreSandboxCpuWeight(layout: CgroupLayout, tag: string, id: string): Promise<void> {
  const dir =
    layout.version === 2
      ? join(layout.root, sandboxCgroup(tag, id))
      : layout.controllers.cpu && join(layout.controllers.cpu, sandboxCgroup(tag, id));
  if (!dir || layout.missing.includes("cpu")) return;
  const { file, value } = DEFAULT_CPU_WEIGHT[layout.version];
  await writeFile(join(dir, file), value);
}

async function enableControllers(dir: string): Promise<void> {
  await writeFile(join(dir, "cgroup.subtree_control"), LIMIT_CONTROLLERS.map((c) => `+${c}`).join(" "));
}

/**
 * Makes the sandbox's cgroup with these limits (an existing one is reused and its limits set
 * again) and returns the `cgroup.procs` files a process writes its pid into to join it.
 */
export async function createSandboxCgroup(
  layout: CgroupLayout,
  tag: string,
  id: string,
  limits: CgroupLimits,
): Promise<string[]> {
  if (layout.version === 2) {
    const dir = join(layout.root, sandboxCgroup(tag, id));
    const parent = dirname(dir);
    await enableControllers(layout.root);
    await mkdir(parent, { recursive: true });
    await enableControllers(parent);
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, "cpu.max"), `${limits.cpuQuotaUs} ${limits.cpuPeriodUs}`);
    await writeFile(join(dir, "memory.max"), String(limits.memoryBytes));
    await writeFile(join(dir, "pids.max"), String(limits.pids));
    return [join(dir, "cgroup.procs")];
  }
  const { cpu, memory, pids } = layout.controllers;
  if (cpu === undefined || memory === undefined || pids === undefined)
    throw new BothyError("internal", "A sandbox cgroup was asked for on a host without the controllers it needs.");
  const dirs = {
    cpu: join(cpu, sandboxCgroup(tag, id)),
    memory: join(memory, sandboxCgroup(tag, id)),
    pids: join(pids, sandboxCgroup(tag, id)),
  };
  for (const dir of new Set(Object.values(dirs))) await mkdir(dir, { recursive: true });
  await writeFile(join(dirs.cpu, "cpu.cfs_period_us"), String(limits.cpuPeriodUs));
  await writeFile(join(dirs.cpu, "cpu.cfs_quota_us"), String(limits.cpuQuotaUs));
  await writeFile(join(dirs.memory, "memory.limit_in_bytes"), String(limits.memoryBytes));
  await writeFile(join(dirs.pids, "pids.max"), String(limits.pids));
  return [...new Set(Object.values(dirs))].map((d) => join(d, "cgroup.procs"));
}

const EMPTY_WAIT_MS = 10_000;

/**
 * Removes the sandbox's cgroup directories wherever they exist. A cgroup keeps a task that was
 * just killed for a moment, so an occupied one is waited for up to `waitMs`; with 0 it is left
 * as it is (its processes are not the caller's: removal by id is asked of every driver).
 */
export async function removeSandboxCgroup(
  layout: CgroupLayout,
  tag: string,
  id: string,
  waitMs = EMPTY_WAIT_MS,
): Promise<void> {
  for (const dir of sandboxCgroupDirs(layout, tag, id)) {
    const deadline = Date.now() + waitMs;
    for (;;) {
      try {
        await rmdir(dir);
        break;
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === "ENOENT" || (code === "EBUSY" && waitMs === 0)) break;
        if (code !== "EBUSY" || Date.now() > deadline)
          throw new BothyError("internal", `Could not remove the sandbox's cgroup ${dir}.`, { cause: err });
        await new Promise((r) => setTimeout(r, 50));
      }
    }
  }
}

/** The home's parent cgroup (`bothy-<tag>`) in each hierarchy of this layout. */
export function homeCgroupDirs(layout: CgroupLayout, tag: string): string[] {
  const parent = dirname(sandboxCgroup(tag, "x"));
  return (layout.version === 2 ? [layout.root] : layout.hierarchies).map((h) => join(h, parent));
}

/**
 * Removes the home's parent cgroups once its sandboxes have stopped (a clean stop): each test
 * home, and each server, would otherwise leave one per hierarchy. One still holding a sandbox's
 * cgroup stays for the next start.
 */
export async function removeHomeCgroups(layout: CgroupLayout, tag: string): Promise<void> {
  for (const dir of homeCgroupDirs(layout, tag)) {
    try {
      await rmdir(dir);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== "ENOENT" && code !== "ENOTEMPTY" && code !== "EBUSY") throw err;
    }
  }
}
