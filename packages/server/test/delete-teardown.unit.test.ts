import { afterEach, describe, expect, it } from "vitest";
import { loadConfig } from "../src/config.ts";
import { DriverRegistry } from "../src/drivers/driver-registry.ts";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { SandboxManager, type TemplateSource } from "../src/sandboxes/sandbox-manager.ts";
import { Sweeper } from "../src/sandboxes/sweeper.ts";
import { FakeDriver, FakeHost } from "./helpers/fake-driver.ts";

/**
 * Delete off the caller's clock, with fake drivers and a real (in-memory) ledger: the answer comes
 * once the sandbox is `deleting` and unreachable; a teardown that fails leaves the row `deleting`
 * and its host objects owned by nobody, and the sweeper's next pass, or a restart, finishes it.
 */
const template = { name: "seed", hash: "h1", rootfs: "/nonexistent/rootfs", env: {} };
const templates: TemplateSource = { resolve: async (name) => (name === "seed" ? template : undefined) };

class World {
  readonly host = new FakeHost();
  ledger!: LedgerStore;
  readonly events: string[] = [];
  manager!: SandboxManager;
  drivers!: DriverRegistry;
  private waiters: Array<{ event: string; id: string; resolve: () => void }> = [];

  async boot(): Promise<void> {
    this.ledger ??= await openStore({ sqlitePath: ":memory:" });
    this.drivers = new DriverRegistry(
      new Map([["gvisor", new FakeDriver("gvisor", this.host)]]),
      new Map(),
      "gvisor",
      "fake",
    );
    const config = loadConfig({ BOTHY_HOME: "/nonexistent/bothy-delete", BOTHY_NETWORK: "off", BOTHY_POOL_SIZE: "0" });
    this.manager = new SandboxManager(config, this.ledger, this.drivers, templates, (event, fields) => {
      const id = (fields as { sandbox_id?: string }).sandbox_id ?? "";
      this.events.push(`${event} ${id}`);
      for (const w of this.waiters.filter((x) => x.event === event && x.id === id)) w.resolve();
    });
    await this.manager.reconcile();
  }

  /** Resolves when the manager logs `event` for `id` (the teardown's end, or its failure). */
  next(event: string, id: string): Promise<void> {
    return new Promise((resolve) => this.waiters.push({ event, id, resolve }));
  }

  async create(): Promise<string> {
    return (await this.manager.create({ template: "seed", vcpu: 1, memory_mib: 256 }, undefined)).sandbox.sandbox_id;
  }

  async state(id: string): Promise<string | undefined> {
    return (await this.ledger.getSandbox(id))?.state;
  }
}

describe("delete off the caller's clock", () => {
  let world: World | undefined;
  afterEach(() => world?.ledger.close());

  it("answers deleting and unreachable, then ends deleted with nothing left; a second delete answers the same", async () => {
    const w = (world = new World());
    await w.boot();
    const id = await w.create();
    const deleted = w.next("sandbox_deleted", id);
    const answer = await w.manager.delete(id);
    expect(answer.state).toBe("deleting");
    await expect(w.manager.agent(id)).rejects.toThrow(/deleting/);
    expect((await w.manager.delete(id)).state).toMatch(/^(deleting|deleted)$/);
    await deleted;
    expect(await w.state(id)).toBe("deleted");
    expect(w.host.ids()).toEqual([]);
    expect((await w.manager.delete(id, "requested", { wait: true })).state).toBe("deleted");
  });

  it("with wait, answers once the teardown has ended", async () => {
    const w = (world = new World());
    await w.boot();
    const id = await w.create();
    expect((await w.manager.delete(id, "requested", { wait: true })).state).toBe("deleted");
    expect(w.host.ids()).toEqual([]);
  });

  it("a failed teardown leaves the row deleting; the sweeper's next pass finishes it", async () => {
    const w = (world = new World());
    await w.boot();
    const id = await w.create();
    w.host.failRemovals = 1;
    const failed = w.next("sandbox_delete_failed", id);
    expect((await w.manager.delete(id)).state).toBe("deleting");
    await failed;
    expect(await w.state(id)).toBe("deleting");
    expect(w.host.ids()).toEqual([id]);
    await new Promise((resolve) => setImmediate(resolve)); // the failed delete lets go of its record
    expect(w.manager.ownedIds().has(id)).toBe(false);
    await new Sweeper(w.manager, w.ledger, w.drivers, 1_000_000, () => undefined).sweep();
    expect(await w.state(id)).toBe("deleted");
    expect(w.host.ids()).toEqual([]);
  });

  it("a restart finishes a delete whose teardown did not end, and a clean stop waits for one under way", async () => {
    const w = (world = new World());
    await w.boot();
    const kept = await w.create();
    w.host.failRemovals = 1;
    const failed = w.next("sandbox_delete_failed", kept);
    await w.manager.delete(kept);
    await failed;
    const running = await w.create();
    expect((await w.manager.delete(running)).state).toBe("deleting");
    await w.manager.close();
    expect(await w.state(running)).toBe("deleted");
    expect(await w.state(kept)).toBe("deleting");
    await w.boot();
    expect(await w.state(kept)).toBe("deleted");
    expect(w.host.ids()).toEqual([]);
  });
});
