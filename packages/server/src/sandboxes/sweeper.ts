import type { DriverRegistry } from "../drivers/driver-registry.ts";
import type { HostObject } from "../drivers/driver.ts";
import type { LedgerStore } from "../ledger/store.ts";
import type { Logger, SandboxManager } from "./sandbox-manager.ts";

/**
 * The periodic pass that keeps the host honest: it deletes sandboxes whose time ran out (or puts
 * them to sleep, when their create asked for `on_timeout: "sleep"`), marks
 * the ones that died without the driver saying so, and removes every host object no sandbox of
 * this server owns. One pass runs at start and then every `intervalMs`; passes never overlap.
 *
 * An object is removed only when two passes in a row found it unowned, so one that a create,
 * delete or death was handling while the drivers were listed is never raced, and the log does not
 * report what its owner removed a moment later.
 */
export class Sweeper {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private suspects = new Set<string>();
  private stopped = false;
  private readonly steps: Array<() => Promise<void>> = [];

  constructor(
    private readonly manager: SandboxManager,
    private readonly ledger: LedgerStore,
    private readonly drivers: DriverRegistry,
    private readonly intervalMs: number,
    private readonly log: Logger,
    /**
     * Whether this process may act on its host's sandboxes now: a node of a cluster only while it
     * surely holds its lease (cluster/node-lease.ts), asked before each step and each removal.
     */
    private readonly mayAct: () => boolean = () => true,
  ) {}

  /** Adds a step every pass runs after deleting expired sandboxes (e.g. idle sleep). */
  addStep(step: () => Promise<void>): void {
    this.steps.push(step);
  }

  start(): void {
    void this.sweep();
    this.timer = setInterval(() => void this.sweep(), this.intervalMs);
    this.timer.unref();
  }

  /** Runs one pass now, or waits for the one in progress. */
  sweep(): Promise<void> {
    if (this.stopped) return Promise.resolve();
    this.running ??= this.pass()
      .catch((err: unknown) => this.log("sweep_failed", { error: (err as Error).message }))
      .finally(() => (this.running = undefined));
    return this.running;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    await this.running;
  }

  private halted(): boolean {
    return this.stopped || !this.mayAct();
  }

  private async pass(): Promise<void> {
    if (this.halted()) return;
    await this.deleteExpired();
    for (const step of this.steps) {
      if (this.halted()) return;
      await step();
    }
    if (this.halted()) return;
    await this.manager.finishDeletes("completed by the sweeper");
    if (this.halted()) return;
    const before = this.manager.liveIds();
    const objects = (await Promise.all(this.drivers.all().map((d) => d.reconcile()))).flat();
    if (this.halted()) return;
    await this.manager.checkAlive(before, new Set(objects.map((o) => o.sandboxId)));
    await this.manager.closeUnownedRows("The sandbox was gone from the host; the sweeper closed its record.");
    await this.removeOrphans(objects);
  }

  private async deleteExpired(): Promise<void> {
    for (const row of await this.ledger.expiredSandboxes(new Date().toISOString())) {
      if (this.halted()) return;
      // Asleep past its timeout, it is deleted at the end of its retention (sleep-wake.ts).
      const lifecycle = await this.ledger.lifecycle.of(row.id);
      if (lifecycle?.on_timeout === "sleep" && lifecycle.asleep_by !== "timeout") {
        try {
          await this.manager.sleepOnTimeout(row.id);
        } catch (err) {
          this.log("sandbox_sleep_failed", { sandbox_id: row.id, error: (err as Error).message });
        }
        continue;
      }
      this.log("sandbox_expired", { sandbox_id: row.id, expires_at: row.expires_at });
      try {
        await this.manager.delete(row.id, "expired");
      } catch (err) {
        this.log("sweep_delete_failed", { sandbox_id: row.id, error: (err as Error).message });
      }
    }
  }

  private async removeOrphans(objects: HostObject[]): Promise<void> {
    const byId = await this.manager.unowned(objects);
    const confirmed = [...byId.keys()].filter((id) => this.suspects.has(id));
    this.suspects = new Set([...byId.keys()].filter((id) => !confirmed.includes(id)));
    for (const id of confirmed) {
      // Ownership is checked again at the last moment (in removeUnowned): a create or wake may have taken the id since.
      if (this.halted()) return;
      try {
        await this.manager.removeUnowned(id, byId.get(id) ?? [], "sweeper");
      } catch (err) {
        this.suspects.add(id); // tried again next pass
        this.log("orphan_remove_failed", { sandbox_id: id, error: (err as Error).message });
      }
    }
  }
}
