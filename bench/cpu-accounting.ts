/**
 * Who spends the CPU of a create (bench/start): this process (the in-process server and the
 * bench's client), the host commands it spawns, the sandboxes' own cgroups (runsc's sentry,
 * gofer and ptrace stubs, the agent inside), and the rest of the host. The host commands are
 * told apart by moving this process into a cpuacct cgroup of its own for the measurement: its
 * children start there, while runsc moves a sandbox's sentry and gofer into the sandbox's cgroup
 * (`bothy-<tag>/<id>`, whose parent keeps counting after each sandbox's cgroup is gone).
 */
import childProcess from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, readFile, rmdir, writeFile } from "node:fs/promises";
import { syncBuiltinESMExports } from "node:module";
import { basename, join } from "node:path";
import { hostCgroupLayout, homeCgroupDirs } from "../packages/server/src/drivers/host-cgroups.ts";
import { hostTag } from "../packages/server/src/util/host-names.ts";

/** CPU seconds spent since some start, by whom. */
export interface CpuSample {
  /** This process: the server (in-process) and the bench's own client. */
  server: number;
  /** Processes this one spawned that stayed in its cgroup: host commands, runsc's own CLI processes. */
  commands: number | undefined;
  /** Every sandbox's host cgroup of the server's home. */
  sandboxes: number | undefined;
  /** The whole host, busy (/proc/stat): the rest is kernel threads and other load. */
  host: number;
  /** Programs spawned, by name. */
  spawns: Map<string, number>;
}

const spawns = new Map<string, number>();
let counting = false;

/**
 * Counts every program this process spawns, by name (the server's host commands use
 * `child_process.spawn`; ESM importers see the wrapper through syncBuiltinESMExports).
 */
function countSpawns(): void {
  if (counting) return;
  counting = true;
  const original = childProcess.spawn;
  const counted = ((file: string, ...rest: unknown[]) => {
    const name = basename(file);
    spawns.set(name, (spawns.get(name) ?? 0) + 1);
    return (original as (...a: unknown[]) => childProcess.ChildProcess)(file, ...rest);
  }) as typeof childProcess.spawn;
  childProcess.spawn = counted;
  syncBuiltinESMExports();
}

/** CPU seconds the whole host has spent busy since boot (/proc/stat, USER_HZ 100). */
export async function hostBusySeconds(): Promise<number> {
  const fields = (await readFile("/proc/stat", "utf8")).split("\n")[0]?.trim().split(/\s+/).slice(1).map(Number) ?? [];
  const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0, steal = 0] = fields;
  return (user + nice + system + irq + softirq + steal) / 100;
}

/** A cgroup's CPU seconds: cgroup v1 cpuacct, or v2 cpu.stat; 0 for one not made yet. */
async function cgroupSeconds(dir: string): Promise<number | undefined> {
  // The home's parent cgroup appears with its first sandbox: it has counted nothing before.
  if (!existsSync(dir)) return 0;
  try {
    if (existsSync(join(dir, "cpuacct.usage"))) return Number(await readFile(join(dir, "cpuacct.usage"), "utf8")) / 1e9;
    const stat = await readFile(join(dir, "cpu.stat"), "utf8");
    const usec = /^usage_usec (\d+)/m.exec(stat)?.[1];
    return usec === undefined ? undefined : Number(usec) / 1e6;
  } catch {
    return undefined;
  }
}

/**
 * Starts accounting for a server whose home is `home`. `close` puts this process back where it
 * was and removes its cgroup; where the host's cgroups do not allow it, `commands` is undefined.
 */
export async function cpuAccounting(home: string): Promise<{
  sample(): Promise<CpuSample>;
  close(): Promise<void>;
}> {
  countSpawns();
  const layout = await hostCgroupLayout();
  const hierarchy =
    layout.version === 2 ? layout.root : layout.hierarchies.find((h) => existsSync(join(h, "cpuacct.usage")));
  const sandboxesDir = homeCgroupDirs(layout, hostTag(home)).find((d) => d.startsWith(`${hierarchy ?? "-"}/`));
  const own = hierarchy === undefined ? undefined : join(hierarchy, `bothy-bench-${process.pid}`);
  let before: string | undefined;
  if (own !== undefined && hierarchy !== undefined) {
    const line = (await readFile("/proc/self/cgroup", "utf8"))
      .split("\n")
      .find((l) => (layout.version === 2 ? l.startsWith("0::") : l.split(":")[1]?.split(",").includes("cpuacct")));
    before = line === undefined ? undefined : join(hierarchy, line.split(":").slice(2).join(":"));
    try {
      await mkdir(own);
      await writeFile(join(own, "cgroup.procs"), String(process.pid));
    } catch {
      await rmdir(own).catch(() => undefined);
      before = undefined;
    }
  }
  const moved = before !== undefined;
  const start = await read();
  async function read(): Promise<CpuSample> {
    const cpu = process.cpuUsage();
    return {
      server: (cpu.user + cpu.system) / 1e6,
      commands: moved && own !== undefined ? await cgroupSeconds(own) : undefined,
      sandboxes: sandboxesDir === undefined ? undefined : await cgroupSeconds(sandboxesDir),
      host: await hostBusySeconds(),
      spawns: new Map(spawns),
    };
  }
  return {
    async sample(): Promise<CpuSample> {
      const now = await read();
      const diff = (a: number | undefined, b: number | undefined): number | undefined =>
        a === undefined || b === undefined ? undefined : a - b;
      const server = now.server - start.server;
      const inOwnCgroup = diff(now.commands, start.commands);
      return {
        server,
        // The cgroup holds this process too: what is left is its children's.
        commands: inOwnCgroup === undefined ? undefined : Math.max(0, inOwnCgroup - server),
        sandboxes: diff(now.sandboxes, start.sandboxes),
        host: now.host - start.host,
        spawns: new Map([...now.spawns].map(([k, n]) => [k, n - (start.spawns.get(k) ?? 0)])),
      };
    },
    async close(): Promise<void> {
      if (!moved || before === undefined || own === undefined) return;
      await writeFile(join(before, "cgroup.procs"), String(process.pid));
      await rmdir(own);
    },
  };
}
