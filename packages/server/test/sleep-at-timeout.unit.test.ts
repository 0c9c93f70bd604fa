import { afterEach, describe, expect, it } from "vitest";
import { BothyError } from "@bothy/protocol";
import { loadConfig } from "../src/config.ts";
import { DriverRegistry } from "../src/drivers/driver-registry.ts";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { SandboxManager, type TemplateSource } from "../src/sandboxes/sandbox-manager.ts";
import { FakeDriver, FakeHost } from "./helpers/fake-driver.ts";

/**
 * The sleep at a sandbox's timeout (`on_timeout: "sleep"`) and its wake gate (`auto_wake: false`),
 * with a fake gVisor driver and a real (in-memory) ledger: the order of operations on the
 * sandbox's actor decides, never a check made before its turn.
 */
const template = { name: "seed", hash: "h1", rootfs: "/nonexistent/rootfs", env: {} };
const templates: TemplateSource = {
  resolve: async (name) => (name === "seed" ? template : undefined),
  resolveBuild: async (name, hash) => (name === "seed" && hash === template.hash ? template : undefined),
};

const ledgers: LedgerStore[] = [];
afterEach(async () => {
  await Promise.all(ledgers.splice(0).map((l) => l.close()));
});

async function world(lifecycle: { on_timeout?: "sleep"; auto_wake?: boolean }): Promise<{
  manager: SandboxManager;
  ledger: LedgerStore;
  id: string;
}> {
  const host = new FakeHost();
  const ledger = await openStore({ sqlitePath: ":memory:" });
  ledgers.push(ledger);
  const drivers = new DriverRegistry(
    new Map([["gvisor", new FakeDriver("gvisor", host)]]),
    new Map(),
    "gvisor",
    "fake",
  );
  const config = loadConfig({ BOTHY_HOME: "/nonexistent/bothy-sleep", BOTHY_NETWORK: "off", BOTHY_POOL_SIZE: "0" });
  const manager = new SandboxManager(config, ledger, drivers, templates, () => undefined);
  await manager.reconcile();
  const body = { template: "seed", vcpu: 1, memory_mib: 256, timeout_s: 600, ...lifecycle };
  const id = (await manager.create(body, undefined)).sandbox.sandbox_id;
  return { manager, ledger, id };
}

const past = (): string => new Date(Date.now() - 1000).toISOString();

describe("sleep at the timeout", () => {
  it("an implicit wake that passed the gate before a timeout's sleep marked the sandbox is refused in its turn", async () => {
    const w = await world({ on_timeout: "sleep", auto_wake: false });
    await w.manager.sleep(w.id); // idle sleep: any call may wake it
    expect((await w.ledger.getSandbox(w.id))?.state).toBe("stopped");
    await w.ledger.setExpiresAt(w.id, past());

    // Queued in this order on the sandbox's actor: the timeout's sleep first, then the call's wake.
    const timedOut = w.manager.sleepOnTimeout(w.id);
    const call = w.manager.ensureRunning(w.id).catch((e: unknown) => e);
    await timedOut;
    const err = await call;
    expect(err).toBeInstanceOf(BothyError);
    expect((err as BothyError).code).toBe("sandbox_asleep");
    expect((await w.ledger.getSandbox(w.id))?.state).toBe("stopped");
    expect((await w.ledger.lifecycle.of(w.id))?.asleep_by).toBe("timeout");
    expect(Date.parse((await w.ledger.getSandbox(w.id))?.expires_at ?? "")).toBeGreaterThan(
      Date.now() + 29 * 86_400_000,
    );
    // Its final deadline stays where it is while it sleeps.
    await expect(w.manager.setTimeout(w.id, { timeout_s: 60 })).rejects.toThrow(/asleep since its timeout/);

    // A resume wakes it, with its timeout again.
    expect((await w.manager.resume(w.id)).state).toBe("running");
    expect((await w.ledger.lifecycle.of(w.id))?.asleep_by).toBeNull();
    const expires = Date.parse((await w.ledger.getSandbox(w.id))?.expires_at ?? "");
    expect(expires).toBeGreaterThan(Date.now() + 500_000);
    expect(expires).toBeLessThan(Date.now() + 700_000);
  });

  it("a timeout moved on before the sleep's turn wins: the sandbox runs on", async () => {
    const w = await world({ on_timeout: "sleep" });
    await w.ledger.setExpiresAt(w.id, past());
    await w.manager.setTimeout(w.id, { timeout_s: 60 });
    await w.manager.sleepOnTimeout(w.id);
    expect((await w.ledger.getSandbox(w.id))?.state).toBe("running");
    expect((await w.ledger.lifecycle.of(w.id))?.asleep_by).toBeNull();
  });

  it("with auto_wake (the default) the next call wakes it, and a default sandbox keeps no lifecycle row", async () => {
    const w = await world({ on_timeout: "sleep" });
    await w.ledger.setExpiresAt(w.id, past());
    await w.manager.sleepOnTimeout(w.id);
    expect((await w.ledger.getSandbox(w.id))?.state).toBe("stopped");
    expect((await w.manager.ensureRunning(w.id)).state).toBe("running");
    expect(await w.manager.info(w.id)).toMatchObject({ on_timeout: "sleep", auto_wake: true });

    const plain = (await w.manager.create({ template: "seed", vcpu: 1, memory_mib: 256 }, undefined)).sandbox;
    expect(plain).toMatchObject({ on_timeout: "delete", auto_wake: true });
    expect(await w.ledger.lifecycle.of(plain.sandbox_id)).toBeUndefined();
  });
});
