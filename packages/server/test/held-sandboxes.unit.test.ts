import { afterEach, describe, expect, it } from "vitest";
import { execQuiet } from "../src/agent/quiet-exec.ts";
import { loadConfig } from "../src/config.ts";
import { DriverRegistry } from "../src/drivers/driver-registry.ts";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { SandboxManager, type TemplateSource } from "../src/sandboxes/sandbox-manager.ts";
import { FakeDriver, FakeHost } from "./helpers/fake-driver.ts";

/**
 * Letting go of a held sandbox, with a fake driver and a real (in-memory) ledger. A sandbox dying
 * on its own: its agent's channel closing is the first sign (a gVisor sandbox killed at its memory
 * limit closes it ~0.1 s before `runsc run` ends), so by the time a command hears that its sandbox
 * is gone, the sandbox reads `stopped`, and the next call starts it again. A sleep: it looks again
 * whether the sandbox is idle once its turn has come and the disk is flushed.
 */
const template = { name: "seed", hash: "h1", rootfs: "/nonexistent/rootfs", env: {} };
const templates: TemplateSource = { resolve: async (name) => (name === "seed" ? template : undefined) };

interface World {
  host: FakeHost;
  manager: SandboxManager;
  /** Each event the manager logged, as `name {fields}`. */
  events: string[];
  ledger: LedgerStore;
}

const ledgers: LedgerStore[] = [];
afterEach(async () => {
  await Promise.all(ledgers.splice(0).map((l) => l.close()));
});

/** A manager on one fake gVisor driver, with a sandbox created. */
async function world(): Promise<World & { id: string }> {
  const host = new FakeHost();
  const ledger = await openStore({ sqlitePath: ":memory:" });
  ledgers.push(ledger);
  const drivers = new DriverRegistry(
    new Map([["gvisor", new FakeDriver("gvisor", host)]]),
    new Map(),
    "gvisor",
    "fake",
  );
  const config = loadConfig({ BOTHY_HOME: "/nonexistent/bothy-held", BOTHY_NETWORK: "off", BOTHY_POOL_SIZE: "0" });
  const events: string[] = [];
  const manager = new SandboxManager(config, ledger, drivers, templates, (event, fields) =>
    events.push(`${event} ${JSON.stringify(fields)}`),
  );
  await manager.reconcile();
  const id = (await manager.create({ template: "seed", vcpu: 1, memory_mib: 256 }, undefined)).sandbox.sandbox_id;
  return { host, manager, events, ledger, id };
}

describe("a sandbox that dies on its own", () => {
  it("is stopped when its agent's channel closes, before its process has ended; the next call starts it again", async () => {
    const w = await world();
    const { id } = w;
    const agent = await w.manager.agent(id);

    expect(w.host.loseChannel(id)).toBe(true);
    await new Promise((r) => setImmediate(r));
    expect(agent.isClosed).toBe(true);
    expect((await w.ledger.getSandbox(id))?.state).toBe("stopped");
    expect((await w.ledger.getSandbox(id))?.error).toMatch(
      /stopped unexpectedly: its agent channel closed.*files are kept/,
    );
    expect(w.events.find((e) => e.startsWith("sandbox_died"))).toMatch(/its agent channel closed/);
    expect(w.events.filter((e) => e.startsWith("sandbox_died"))).toHaveLength(1);

    // The server ends what was left of it (its process ran on), keeping the disk.
    for (let i = 0; i < 10 && w.host.running(id); i++) await new Promise((r) => setImmediate(r));
    expect(w.host.running(id)).toBe(false);
    expect(w.host.machines.get(id)?.disk).toBe(true);

    await w.manager.ensureRunning(id);
    await execQuiet(await w.manager.agent(id), "true", 1000, "Running a command");
    expect((await w.ledger.getSandbox(id))?.state).toBe("running");
    expect(w.events.filter((e) => e.startsWith("sandbox_died"))).toHaveLength(1);
  });

  it("is not counted dead when the host closes its channel on purpose", async () => {
    const w = await world();
    const { id } = w;
    await w.manager.sleep(id);
    expect((await w.ledger.getSandbox(id))?.state).toBe("stopped");
    expect(w.events.some((e) => e.startsWith("sandbox_died"))).toBe(false);
    await w.manager.delete(id, "requested", { wait: true });
    expect(w.events.some((e) => e.startsWith("sandbox_died"))).toBe(false);
  });
});

describe("idle sleep's second look", () => {
  it("keeps a sandbox running when it stopped being idle during the sleep's flush; sleeps it when not", async () => {
    const { manager, ledger, events, id } = await world();
    const slept = (): boolean => events.some((e) => e.startsWith("sandbox_slept"));

    // Idle when the sleep's turn comes; a command arrived while the disk was flushed.
    const looks: boolean[] = [true, false];
    await manager.sleep(id, () => looks.shift() ?? false);
    expect(looks).toEqual([]);
    expect((await ledger.getSandbox(id))?.state).toBe("running");
    expect(slept()).toBe(false);
    await execQuiet(await manager.agent(id), "true", 1000, "Running a command");

    // Busy already when its turn came: not even flushed.
    await manager.sleep(id, () => false);
    expect((await ledger.getSandbox(id))?.state).toBe("running");

    await manager.sleep(id, () => true);
    expect((await ledger.getSandbox(id))?.state).toBe("stopped");
    expect(slept()).toBe(true);
  });
});
