import { loadConfig } from "../../src/config.ts";
import { DriverRegistry } from "../../src/drivers/driver-registry.ts";
import { ServerEvents } from "../../src/events/server-events.ts";
import { openStore, type LedgerStore } from "../../src/ledger/store.ts";
import { SandboxManager, type TemplateSource } from "../../src/sandboxes/sandbox-manager.ts";
import { Sweeper } from "../../src/sandboxes/sweeper.ts";
import { FakeDriver, FakeHost } from "./fake-driver.ts";

/** The template every fake world knows; `hash` changes when a test "rebuilds" it. */
export const fakeTemplate = { name: "seed", hash: "h1", rootfs: "/nonexistent/rootfs", env: {} };

/**
 * A sandbox manager over fake drivers (both `gvisor`-like and `qemu`-like) and a real in-memory
 * ledger, for lifecycle unit tests: the host, the ledger and the log it wrote are all in reach.
 * `boot` again after `manager.close()` (or without it, after `host.crashServer`) is a restart.
 */
export class FakeWorld {
  readonly host = new FakeHost();
  ledger!: LedgerStore;
  readonly events: Array<{ event: string; fields: Record<string, unknown> }> = [];
  /** The server's event bus, as the manager's log feeds it in a real server (subscribers outlive a restart). */
  readonly bus = new ServerEvents();
  template = { ...fakeTemplate };
  manager!: SandboxManager;
  drivers!: DriverRegistry;
  private sweeper: Sweeper | undefined;
  private waiters: Array<{ event: string; id: string; resolve: () => void }> = [];

  constructor(private readonly env: Record<string, string> = {}) {}

  /** Opens the world's ledger (an in-memory SQLite store); `boot` does so when it was not. */
  async open(): Promise<this> {
    this.ledger ??= await openStore({ sqlitePath: ":memory:" });
    return this;
  }

  async boot(): Promise<void> {
    await this.open();
    const host = this.host;
    this.drivers = new DriverRegistry(
      new Map([
        ["gvisor", new FakeDriver("gvisor", host)],
        ["qemu", new FakeDriver("qemu", host)],
      ]),
      new Map(),
      "gvisor",
      "fake",
    );
    const config = loadConfig({
      BOTHY_HOME: "/nonexistent/bothy-fake-world",
      BOTHY_NETWORK: "off",
      BOTHY_POOL_SIZE: "0",
      ...this.env,
    });
    const templates: TemplateSource = {
      resolve: async (name) => (name === "seed" ? this.template : undefined),
      resolveBuild: async (name, hash) => (name === "seed" && hash === this.template.hash ? this.template : undefined),
    };
    this.manager = new SandboxManager(config, this.ledger, this.drivers, templates, (event, fields) => {
      const f = fields as Record<string, unknown>;
      this.events.push({ event, fields: f });
      const id = typeof f["sandbox_id"] === "string" ? f["sandbox_id"] : "";
      for (const w of this.waiters.filter((x) => x.event === event && x.id === id)) w.resolve();
      this.bus.emit(event, fields);
    });
    this.sweeper = undefined;
    await this.manager.reconcile();
  }

  /** Resolves when the manager logs `event` for `id`. */
  next(event: string, id: string): Promise<void> {
    return new Promise((resolve) => this.waiters.push({ event, id, resolve }));
  }

  async create(body: Record<string, unknown> = {}): Promise<string> {
    const res = await this.manager.create({ template: "seed", vcpu: 1, memory_mib: 256, ...body }, undefined);
    return res.sandbox.sandbox_id;
  }

  async state(id: string): Promise<string | undefined> {
    return (await this.ledger.getSandbox(id))?.state;
  }

  /** One sweeper pass (expiry, deaths, orphans), as the timer would run it; its suspects carry over between passes. */
  sweep(): Promise<void> {
    this.sweeper ??= new Sweeper(this.manager, this.ledger, this.drivers, 1_000_000, () => undefined);
    return this.sweeper.sweep();
  }
}
