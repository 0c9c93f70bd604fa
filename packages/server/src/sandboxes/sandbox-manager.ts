import { BothyError, DORMANT_STATES, LIVE_STATES, type SandboxInfo } from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";
import type { Config } from "../config.ts";
import type { HostObject } from "../drivers/driver.ts";
import type { DriverRegistry } from "../drivers/driver-registry.ts";
import { describeCauses } from "../errors/internal-errors.ts";
import type { Logger } from "../events/server-events.ts";
import type { GatewayPolicies } from "../gateway/policies.ts";
import type { Vault } from "../gateway/vault.ts";
import type { Ledger, SandboxRow } from "../ledger/ledger.ts";
import { HeldSandboxes } from "./held-sandboxes.ts";
import { expiryFrom, parseSetTimeout } from "./lifetime.ts";
import { ManagerContext, type TemplateSource } from "./manager-context.ts";
import { SandboxCreates, type CreateOwner, type CreateResult } from "./sandbox-creates.ts";
import { SandboxDeletes } from "./sandbox-deletes.ts";
import { SleepWake } from "./sleep-wake.ts";
import type { WarmPool } from "./warm-pool.ts";

export type { Logger } from "../events/server-events.ts";
export type { BuiltTemplateRef, TemplateSource } from "./manager-context.ts";
export type { CreateOwner, CreateResult } from "./sandbox-creates.ts";

/**
 * The lifecycle of sandboxes: create (idempotent), look up, delete (idempotent), and the
 * start-up reconcile that removes whatever the ledger does not own.
 */
export class SandboxManager {
  private readonly ctx: ManagerContext;
  private readonly held: HeldSandboxes;
  private readonly pool: WarmPool;
  private readonly creates: SandboxCreates;
  private readonly sleepWake: SleepWake;
  private readonly deletes: SandboxDeletes;
  /** Host policies of tenants and sandboxes, as the gateway applies them. */
  readonly policies: GatewayPolicies;

  constructor(
    config: Config,
    ledger: Ledger,
    drivers: DriverRegistry,
    templates: TemplateSource,
    log: Logger,
    /** The vault that binds secrets to sandboxes, and the CA guests trust; absent: creates naming secrets are refused. */
    gateway?: { vault: Vault; caPem: string },
  ) {
    this.ctx = new ManagerContext(config, ledger, drivers, templates, log, gateway);
    this.policies = this.ctx.policies;
    this.held = new HeldSandboxes(this.ctx);
    this.pool = this.ctx.pool;
    this.creates = new SandboxCreates(this.ctx, this.held);
    this.sleepWake = new SleepWake(this.ctx, this.held);
    this.deletes = new SandboxDeletes(this.ctx);
  }

  /**
   * Start-up recovery, after a clean stop or a crash at any moment. A running sandbox whose VM
   * outlived the old server is attached to and keeps running; other running sandboxes become
   * stopped (their processes ended with the server, or are ended now; the disk stays and the next
   * call starts them again); half-made ones fail; deletes in flight complete; paused and stopped
   * ones stay as they are. Then every host object no row owns is removed, and a dormant
   * sandbox's objects except its disk.
   */
  async reconcile(): Promise<void> {
    for (const row of this.ctx.ledger.liveSandboxes()) {
      if (row.state === "running") {
        // Commands of the old server cannot be followed by this one; they run on in the guest, detached.
        this.ctx.ledger.loseCommands(row.id);
        if (await this.attachAfterRestart(row)) continue;
        this.ctx.ledger.transition(
          row.id,
          "running",
          "stopped",
          "The server restarted and its processes ended; its files are kept and the next call starts it again.",
        );
        this.ctx.log("sandbox_recovered", { sandbox_id: row.id, previous_state: row.state, state: "stopped" });
      } else if (row.state === "creating") {
        this.ctx.ledger.transition(
          row.id,
          "creating",
          "failed",
          "The server restarted while this sandbox was being created.",
        );
        this.ctx.ledger.forgetIdempotencyKeysOf(row.id);
        this.ctx.log("sandbox_lost", { sandbox_id: row.id, previous_state: row.state });
      }
    }
    await this.finishDeletes("completed after restart");
    const objects = (await Promise.all(this.ctx.drivers.all().map((d) => d.reconcile()))).flat();
    for (const [id, found] of this.unowned(objects)) await this.removeUnowned(id, found, "start-up");
  }

  /**
   * Host objects by sandbox that this server does not answer for: everything of an id with no
   * live handle or row, and, of a paused or stopped sandbox, all but its disk.
   */
  unowned(objects: readonly HostObject[]): Map<string, HostObject[]> {
    const owned = this.ownedIds();
    const dormant = this.dormantIds();
    const byId = new Map<string, HostObject[]>();
    for (const o of objects) {
      if (owned.has(o.sandboxId) || (dormant.has(o.sandboxId) && o.disk === true)) continue;
      byId.set(o.sandboxId, [...(byId.get(o.sandboxId) ?? []), o]);
    }
    return byId;
  }

  /** Removes what `unowned` found of one sandbox, unless it was taken since; a dormant sandbox keeps its disk. */
  async removeUnowned(id: string, found: readonly HostObject[], by: string): Promise<void> {
    if (this.ownedIds().has(id)) return;
    const keepDisk = this.dormantIds().has(id);
    this.ctx.log("orphan_removed", {
      sandbox_id: id,
      kind: found.map((o) => o.kind).join(","),
      description: found.map((o) => o.description).join("; "),
      by,
      ...(keepDisk ? { disk_kept: true } : {}),
    });
    await (keepDisk ? this.ctx.drivers.release(id) : this.ctx.drivers.removeOrphan(id));
  }

  /** Paused or stopped sandboxes without a handle in this process: their disk is theirs, nothing else. */
  dormantIds(): Set<string> {
    return new Set(
      this.ctx.ledger
        .liveSandboxes()
        .filter((r) => DORMANT_STATES.includes(r.state) && this.ctx.records.get(r.id)?.booted === undefined)
        .map((r) => r.id),
    );
  }

  /**
   * Ids of every sandbox whose host objects the manager answers for: live, being created,
   * deleted, paused or resumed, dying, and the warm pool's (which have no ledger row).
   */
  ownedIds(): Set<string> {
    return this.ctx.ownedIds();
  }

  /** Ids of the sandboxes held live right now (running or paused). */
  liveIds(): Set<string> {
    return new Set(this.ctx.records.held().map((r) => r.id));
  }

  /** Live ledger rows that no sandbox in this process stands behind become `failed` (dormant ones need none). */
  closeUnownedRows(reason: string): string[] {
    const owned = this.ownedIds();
    const closed: string[] = [];
    for (const row of this.ctx.ledger.liveSandboxes()) {
      // A `deleting` row is finished by finishDeletes, not failed: its host objects may still be there.
      if (owned.has(row.id) || DORMANT_STATES.includes(row.state) || row.state === "deleting") continue;
      this.ctx.ledger.transition(row.id, row.state, "failed", reason);
      this.ctx.ledger.loseCommands(row.id);
      this.ctx.log("sandbox_lost", { sandbox_id: row.id, previous_state: row.state });
      closed.push(row.id);
    }
    return closed;
  }

  /**
   * The sweeper's double-check of deaths the driver's `wait()` should have reported: a sandbox
   * of `before` (live when the drivers were asked) that is still running but whose agent
   * channel has closed, or of which the drivers found nothing on the host, is handled as dead.
   */
  checkAlive(before: ReadonlySet<string>, onHost: ReadonlySet<string>): string[] {
    const dead: string[] = [];
    for (const { id, booted, creating, deleting, queue } of this.ctx.records.held()) {
      if (!booted || !before.has(id) || creating || deleting || queue) continue;
      if (this.ctx.ledger.getSandbox(id)?.state !== "running") continue;
      const why = booted.agent.isClosed
        ? "its agent channel closed"
        : !onHost.has(id)
          ? "the driver found nothing of it on the host"
          : undefined;
      if (why === undefined) continue;
      this.held.lose(id, booted, `The sandbox stopped unexpectedly: ${why}.`, { detected_by: "sweeper", reason: why });
      dead.push(id);
    }
    return dead;
  }

  /** Starts filling the warm pool for the default shape of a template. */
  warm(templateName: string): Promise<void> {
    return this.creates.warm(templateName);
  }

  create(body: unknown, idempotencyKey: string | undefined, owner?: CreateOwner): Promise<CreateResult> {
    return this.creates.create(body, idempotencyKey, owner);
  }

  info(id: string): SandboxInfo {
    return this.ctx.info(id);
  }

  list(): SandboxInfo[] {
    return this.ctx.ledger.listSandboxes().map((row) => this.ctx.view(row));
  }

  counts(): Record<string, number> {
    return this.ctx.ledger.countByState();
  }

  /** The agent of a running sandbox, for commands and files. */
  agent(id: string): AgentClient {
    const info = this.info(id);
    const booted = this.ctx.records.get(id)?.booted;
    if (info.state !== "running" || !booted || booted.agent.isClosed) {
      throw new BothyError(
        "sandbox_not_running",
        `Sandbox ${id} is ${info.state}; only a running sandbox takes commands.`,
      );
    }
    return booted.agent;
  }

  /**
   * Saves a sandbox's memory to disk and stops its VM (QEMU only). Its files and background
   * processes come back with `resume`; commands attached at the time end.
   */
  pause(id: string): Promise<SandboxInfo> {
    return this.sleepWake.pause(id);
  }

  /**
   * Puts an idle sandbox to sleep: paused where the driver saves memory (QEMU), else stopped with
   * its disk kept (gVisor). Either way the next call wakes it.
   */
  sleep(id: string): Promise<SandboxInfo> {
    return this.sleepWake.sleep(id);
  }

  resume(id: string): Promise<SandboxInfo> {
    return this.sleepWake.resume(id);
  }

  /** The sandbox now expires `timeout_s` (from the body) seconds from now, sooner or later than before. */
  setTimeout(id: string, body: unknown): SandboxInfo {
    const info = this.info(id);
    const timeoutS = parseSetTimeout(body, this.ctx.config.lifecycle.maxTimeoutS);
    if (!LIVE_STATES.includes(info.state) || info.state === "deleting") {
      throw new BothyError("sandbox_not_running", `Sandbox ${id} is ${info.state}; only a live sandbox has a timeout.`);
    }
    const expiresAt = expiryFrom(timeoutS);
    this.ctx.ledger.setExpiresAt(id, expiresAt);
    this.ctx.log("sandbox_timeout_set", { sandbox_id: id, timeout_s: timeoutS, expires_at: expiresAt });
    return this.info(id);
  }

  /** Wakes a paused or stopped sandbox first, so commands and file calls need not know about sleep. */
  ensureRunning(id: string): Promise<SandboxInfo> {
    return this.sleepWake.ensureRunning(id);
  }

  /** An API call is using the sandbox: it does not go to sleep until the returned release is called. */
  hold(id: string): () => void {
    const rec = this.ctx.records.of(id);
    rec.holds++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      rec.holds--;
      this.touch(id);
      this.ctx.records.tidy(rec);
    };
  }

  /** Takes over a sandbox that still runs from before the restart; false when it cannot (then it is stopped). */
  private async attachAfterRestart(row: SandboxRow): Promise<boolean> {
    const driver = this.ctx.drivers.all().find((d) => d.name === row.driver);
    if (!driver?.attaches) return false;
    const started = Date.now();
    try {
      const booted = await this.sleepWake.bootFromDisk(row, { attach: true });
      this.held.adopt(booted);
      this.touch(row.id);
      this.ctx.log("sandbox_reattached", { sandbox_id: row.id, driver: row.driver, ms: Date.now() - started });
      return true;
    } catch (err) {
      this.ctx.log("sandbox_reattach_failed", { sandbox_id: row.id, error: describeCauses(err) });
      return false;
    }
  }

  /** Notes activity on a sandbox: idle sleep counts from the last one. */
  touch(id: string): void {
    this.ctx.touch(id);
  }

  /** Forgets the activity of sandboxes that are no longer live. */
  pruneActivity(live: ReadonlySet<string>): void {
    for (const rec of this.ctx.records.all()) {
      if (live.has(rec.id) || rec.lastActive === undefined) continue;
      rec.lastActive = undefined;
      this.ctx.records.tidy(rec);
    }
  }

  /** Milliseconds since the sandbox was last used (created, called, or a command ended). */
  idleFor(id: string): number {
    const last = this.ctx.records.get(id)?.lastActive ?? Date.parse(this.ctx.ledger.getSandbox(id)?.updated_at ?? "");
    return Number.isNaN(last) ? 0 : Date.now() - last;
  }

  /** Whether the sandbox is running and nothing else is changing its state. */
  canSleep(id: string): boolean {
    const rec = this.ctx.records.get(id);
    return (
      rec?.booted !== undefined && this.info(id).state === "running" && !rec.queue && !rec.deleting && rec.holds === 0
    );
  }

  /**
   * Deletes a sandbox, off the caller's clock: the answer comes as soon as it is `deleting` and
   * can no longer be reached; its teardown goes on in the background and ends in `deleted`
   * (sandbox-deletes.ts). Idempotent. With `wait`, the answer comes once the teardown has ended.
   */
  delete(id: string, reason?: string, how?: { wait?: boolean }): Promise<SandboxInfo> {
    return this.deletes.delete(id, reason, how);
  }

  /**
   * Completes every delete no operation of this process is carrying out: one a crash cut short
   * (at start-up) or whose teardown failed (the sweeper tries again each pass).
   */
  finishDeletes(reason: string): Promise<void> {
    return this.deletes.finishDeletes(reason);
  }

  /**
   * Stops every sandbox, keeping its disk: after a restart the next call to it starts it again
   * (a paused one keeps its saved memory too).
   */
  async close(): Promise<void> {
    this.ctx.stopping = true;
    await Promise.allSettled(this.ctx.records.all().map((r) => r.creating));
    await Promise.allSettled(this.ctx.records.all().map((r) => r.queue));
    await this.pool.close();
    await Promise.allSettled(
      this.ctx.records.held().map(async (rec) => {
        const { id, booted } = rec;
        if (!booted) return;
        if (this.ctx.ledger.getSandbox(id)?.state === "paused") {
          this.ctx.records.letGo(rec); // its VM ended at pause; the saved memory stays with the disk
          this.ctx.records.tidy(rec);
          return;
        }
        await this.held.stopOnPurpose(
          id,
          booted,
          "The server stopped; its files are kept and the next call after a restart starts it again.",
          new BothyError("shutting_down", "The server is stopping."),
        );
        this.ctx.log("sandbox_stopped", { sandbox_id: id });
      }),
    );
    await Promise.allSettled(this.ctx.records.all().flatMap((r) => [r.deleting?.done, r.reaping]));
  }
}
