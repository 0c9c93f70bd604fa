import { existsSync, readdirSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  createSandboxCgroup,
  hostCgroupLayout,
  homeCgroupDirs,
  removeHomeCgroups,
  removeSandboxCgroup,
  sandboxCgroup,
} from "../src/drivers/host-cgroups.ts";
import { hostTag } from "../src/util/host-names.ts";
import { hardwareVirtualization, QemuDriver } from "../src/drivers/qemu-driver.ts";
import { VM_MARKER } from "../src/drivers/qemu-sandbox.ts";
import { newSandboxId } from "../src/util/ids.ts";
import { noLeaks } from "./helpers/host-state.ts";
import { api, createSandbox, deleteSandbox } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

/**
 * A sandbox's CPU quota, memory limit and pids backstop, read from the host's own cgroup files
 * of whichever layout this host has (pure cgroup v2, or v1 hierarchies with or without a
 * controller-less cgroup2): the driver's promise, not its word. Deleting the sandbox removes its
 * cgroup everywhere.
 */
const SHAPE = { template: "seed", vcpu: 1, memoryMib: 256, diskMib: 128, maxProcesses: 64 };
const MIB = 1024 * 1024;
const ROOT = "/sys/fs/cgroup";
/** Pure v2 has cgroup.controllers at the root; v1 and hybrid hosts have a directory per hierarchy. */
const V2 = existsSync(join(ROOT, "cgroup.controllers"));

const read = (path: string): string => readFileSync(path, "utf8").trim();

/** What the host's cgroup files say about a sandbox, in one shape for both layouts. */
function limitsOf(
  home: string,
  id: string,
): {
  quotaUs: number;
  periodUs: number;
  memoryBytes: number;
  pids: string;
  procs: string[];
} {
  if (V2) {
    const dir = join(ROOT, sandboxCgroup(hostTag(home), id));
    const [quota = "", period = ""] = read(join(dir, "cpu.max")).split(" ");
    return {
      quotaUs: Number(quota),
      periodUs: Number(period),
      memoryBytes: Number(read(join(dir, "memory.max"))),
      pids: read(join(dir, "pids.max")),
      procs: read(join(dir, "cgroup.procs")).split("\n").filter(Boolean),
    };
  }
  const dir = (controller: string): string => join(ROOT, controller, sandboxCgroup(hostTag(home), id));
  return {
    quotaUs: Number(read(join(dir("cpu"), "cpu.cfs_quota_us"))),
    periodUs: Number(read(join(dir("cpu"), "cpu.cfs_period_us"))),
    memoryBytes: Number(read(join(dir("memory"), "memory.limit_in_bytes"))),
    pids: read(join(dir("pids"), "pids.max")),
    procs: read(join(dir("memory"), "cgroup.procs"))
      .split("\n")
      .filter(Boolean),
  };
}

/** Every cgroup directory of the sandbox that still exists, in any hierarchy, under any home's `bothy-<tag>`. */
function cgroupDirsOf(id: string): string[] {
  const subdirs = (dir: string): string[] =>
    readdirSync(dir, { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => join(dir, e.name));
  const hierarchies = V2 ? [ROOT] : subdirs(ROOT);
  return hierarchies
    .flatMap((h) => subdirs(h).filter((d) => /\/bothy-[a-z2-7]+$/.test(d)))
    .map((d) => join(d, id))
    .filter((d) => existsSync(d));
}

const qemu = testDrivers().find((d) => d.name === "qemu");
describe.skipIf(qemu?.missing !== undefined)(
  driverTitle(qemu ?? { name: "qemu", missing: "qemu" }, "a VM's cgroup left by a crash"),
  () => {
    it("is found by reconcile and removed with the sandbox's other host objects, with or without its directory", async () => {
      // What a server killed between making a VM's cgroup and starting its QEMU leaves: the
      // sandbox's directory (stopped or paused, so it keeps its disk) and an empty cgroup.
      const home = await mkdtemp("/tmp/bothy-test-cgroup-");
      const id = newSandboxId();
      const layout = await hostCgroupLayout();
      try {
        const sandboxesDir = join(home, "sandboxes");
        await mkdir(join(sandboxesDir, id), { recursive: true });
        await writeFile(join(sandboxesDir, id, VM_MARKER), "{}");
        const limits = { cpuQuotaUs: 100_000, cpuPeriodUs: 100_000, memoryBytes: MIB * 256, pids: 64 };
        await createSandboxCgroup(layout, hostTag(home), id, limits);
        expect(cgroupDirsOf(id).length).toBeGreaterThan(0);
        const driver = new QemuDriver({
          home,
          hostTag: hostTag(home),
          sandboxesDir,
          agentPath: "/nonexistent",
          log: () => undefined,
        });
        const found = await driver.reconcile();
        expect(found.filter((o) => o.sandboxId === id).map((o) => [o.kind, o.disk === true])).toEqual([
          ["vm-dir", true],
          ["cgroup", false],
        ]);
        await driver.release(id);
        expect(cgroupDirsOf(id)).toEqual([]);
        expect(existsSync(join(sandboxesDir, id, VM_MARKER))).toBe(true);
        // An orphan's removal is asked of every driver in turn: its directory may be gone first.
        await createSandboxCgroup(layout, hostTag(home), id, limits);
        await rm(join(sandboxesDir, id), { recursive: true });
        await driver.removeOrphan(id);
        expect(cgroupDirsOf(id)).toEqual([]);
      } finally {
        await removeSandboxCgroup(layout, hostTag(home), id);
        await removeHomeCgroups(layout, hostTag(home));
        await rm(home, { recursive: true, force: true });
      }
    });
  },
);

for (const driver of testDrivers()) {
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "host cgroup limits"), () => {
    let ts: TestServer;
    const made: string[] = [];

    beforeAll(async () => {
      ts = await startTestServer({ BOTHY_DRIVER: driver.name });
    }, 300_000);

    afterAll(async () => {
      for (const id of made) await api(ts.url, "DELETE", `/sandboxes/${id}`);
      const tag = hostTag(ts.home);
      expect(await ts?.stop()).toEqual(noLeaks());
      for (const id of made) expect(cgroupDirsOf(id)).toEqual([]);
      // The home's parent cgroups go with a clean stop too.
      expect(homeCgroupDirs(await hostCgroupLayout(), tag).filter((d) => existsSync(d))).toEqual([]);
    });

    it(
      `puts the sandbox in its own cgroup (${V2 ? "cgroup v2" : "cgroup v1"}) with its CPU quota, memory limit and pids backstop, removed on delete`,
      { timeout: 300_000 },
      async () => {
        const id = await createSandbox(ts.url, SHAPE);
        made.push(id);
        const limits = limitsOf(ts.home, id);
        console.info(`${driver.name} sandbox ${id} cgroup limits: ${JSON.stringify(limits)}`);
        expect(limits.periodUs).toBe(100_000);
        expect(limits.quotaUs).toBe(SHAPE.vcpu * 100_000);
        // gVisor: the sandbox's memory exactly; QEMU: the guest's memory, the translation cache
        // (BOTHY_QEMU_TB_MIB under TCG) and QEMU's own 256 MiB.
        const tbMib = driver.name === "qemu" && !(await hardwareVirtualization()) ? ts.config.qemu.tbSizeMib : 0;
        expect(limits.memoryBytes).toBe(
          driver.name === "gvisor" ? SHAPE.memoryMib * MIB : (SHAPE.memoryMib + tbMib + 256) * MIB,
        );
        expect(limits.pids).toBe("4096");
        // The sandbox's processes are really in it: runsc's sandbox, or the VM's QEMU.
        expect(limits.procs.length).toBeGreaterThan(0);
        if (driver.name === "qemu") {
          const cmdline = read(`/proc/${limits.procs[0]}/cmdline`);
          expect(cmdline).toContain("qemu-system");
          expect(cmdline).toContain(id);
        }

        expect(await deleteSandbox(ts.url, id)).toBe("deleted");
        expect(cgroupDirsOf(id)).toEqual([]);
      },
    );

    // gVisor has no pause (501).
    if (driver.name === "qemu")
      it(
        "a paused VM holds no cgroup; its resume puts the new QEMU in one with the same limits",
        { timeout: 300_000 },
        async () => {
          const id = await createSandbox(ts.url, SHAPE);
          made.push(id);
          const before = limitsOf(ts.home, id);
          expect((await api(ts.url, "POST", `/sandboxes/${id}/pause`)).json["state"]).toBe("paused");
          expect(cgroupDirsOf(id)).toEqual([]);
          expect((await api(ts.url, "POST", `/sandboxes/${id}/resume`)).json["state"]).toBe("running");
          const after = limitsOf(ts.home, id);
          expect({ ...after, procs: [] }).toEqual({ ...before, procs: [] });
          expect(read(`/proc/${after.procs[0]}/cmdline`)).toContain(id);
        },
      );
  });
}

/** The CPU weight of a sandbox's cgroup as the host's files say: v1 `cpu.shares`, v2 `cpu.weight`. */
function cpuWeightOf(home: string, id: string): number {
  const cg = sandboxCgroup(hostTag(home), id);
  return Number(read(V2 ? join(ROOT, cg, "cpu.weight") : join(ROOT, "cpu", cg, "cpu.shares")));
}

const gvisor = testDrivers().find((d) => d.name === "gvisor");
describe.skipIf(gvisor?.missing !== undefined)(
  driverTitle(gvisor ?? { name: "gvisor", missing: "gvisor" }, "the warm pool's CPU weight"),
  () => {
    let ts: TestServer;
    beforeAll(async () => {
      ts = await startTestServer({ BOTHY_DRIVER: "gvisor", BOTHY_POOL_SIZE: "1" });
    }, 300_000);
    afterAll(async () => {
      expect(await ts.stop()).toEqual(noLeaks());
    });

    it("boots pool sandboxes at the lowest weight and gives a claimed one the default back", async () => {
      await ts.server.manager.warm("seed");
      const pool = ts.server.manager["pool"];
      // The refill warm() started has booted its sandbox once this settles.
      await Promise.all(pool["filling"].values());
      const [pooled] = [...pool.ownedIds()];
      expect(pooled).toBeDefined();
      const low = cpuWeightOf(ts.home, pooled ?? "");
      // runsc writes the spec's shares (2) on v1 and maps them to a weight on v2.
      expect(low).toBe(V2 ? 1 : 2);
      const id = await createSandbox(ts.url);
      expect(id).toBe(pooled);
      expect(cpuWeightOf(ts.home, id)).toBe(V2 ? 100 : 1024);
      expect(await deleteSandbox(ts.url, id)).toBe("deleted");
    });
  },
);
