import { BothyError, type SandboxInfo } from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";
import type { Config } from "../config.ts";
import type { Driver, HostObject, SandboxHandle } from "../drivers/driver.ts";
import type { DriverRegistry } from "../drivers/driver-registry.ts";
import type { Logger } from "../events/server-events.ts";
import type { GatewayPolicies } from "../gateway/policies.ts";
import type { Vault } from "../gateway/vault.ts";
import type { SandboxRow } from "../ledger/ledger.ts";
import type { LedgerStore } from "../ledger/store.ts";
import type { SnapshotRow } from "../ledger/snapshot-rows.ts";
import { HeldSandboxes } from "./held-sandboxes.ts";
import { isIn } from "./lifecycle.ts";
import { expiryFrom, parseSetTimeout } from "./lifetime.ts";
import type { VolumeService } from "../volumes/volume-service.ts";
import { ManagerContext, type TemplateSource } from "./manager-context.ts";
import { SandboxCreates, type CreateOwner, type CreateResult } from "./sandbox-creates.ts";
import { SandboxDeletes } from "./sandbox-deletes.ts";
import { SandboxRecovery } from "./sandbox-recovery.ts";
import { SleepWake, type WakeBy } from "./sleep-wake.ts";
import type { WarmPool } from "./warm-pool.ts";

export type { Logger } from "../events/server-events.ts";

/** A sandbox as a snapshot operation sees it (`forSnapshot`). */
export interface SnapshotSubject {
  row: SandboxRow;
  dir: string;
  driver: Driver;
  /** Present when it runs: the guest's writes are flushed through it before the capture. */
  agent?: AgentClient;
  /** Present when it runs: a VM is stopped through it for the copy. */
  handle?: SandboxHandle;
}
export type { BuiltTemplateRef, TemplateSource } from "./manager-context.ts";
export type { CreateOwner, CreateResult } from "./sandbox-creates.ts";

/**
 * The lifecycle of sandboxes, as the API, the sweeper and idle sleep see it: look up, create
 * (idempotent; sandbox-creates.ts), pause, sleep, resume and wake (sleep-wake.ts), delete
 * (idempotent; sandbox-deletes.ts), activity for idle sleep, start-up reconcile and the sweeper's
 * ownership questions (sandbox-recovery.ts), and a clean stop. The parts share one
 * `ManagerContext` (records, pool, ledger, drivers) and `HeldSandboxes` (adopt, lose, stop).
 */
export class SandboxManager {
  private readonly ctx: ManagerContext;
  private readonly held: HeldSandboxes;
  private readonly pool: WarmPool;
  private readonly creates: SandboxCreates;
  private readonly sleepWake: SleepWake;
  private readonly deletes: SandboxDeletes;
  private readonly recovery: SandboxRecovery;
  /** Host policies of tenants and sandboxes, as the gateway applies them. */
  readonly policies: GatewayPolicies;

  constructor(
    config: Config,
    ledger: LedgerStore,
    drivers: DriverRegistry,
    templates: TemplateSource,
    log: Logger,
    /** The vault that binds secrets to sandboxes, and the CA guests trust; absent: creates naming secrets are refused. */
    gateway?: { vault: Vault; caPem: string },
    volumes?: VolumeService,
  ) {
    this.ctx = new ManagerContext(config, ledger, drivers, templates, log, gateway, volumes);
    this.policies = this.ctx.policies;
    this.held = new HeldSandboxes(this.ctx);
    this.pool = this.ctx.pool;
    this.creates = new SandboxCreates(this.ctx, this.held);
    this.sleepWake = new SleepWake(this.ctx, this.held);
    this.deletes = new SandboxDeletes(this.ctx);
    this.recovery = new SandboxRecovery(this.ctx, this.held, this.sleepWake, this.deletes);
  }

  info(id: string): Promise<SandboxInfo> {
    return this.ctx.info(id);
  }

  async list(): Promise<SandboxInfo[]> {
    return this.ctx.views(await this.ctx.ledger.listSandboxes());
  }

  counts(): Promise<Record<string, number>> {
    return this.ctx.ledger.countByState();
  }

  /**
   * The agent of a sandbox this process holds running, from memory: undefined for any other (a
   * paused sandbox's agent is closed; a stopped, deleted or unknown one has none here).
   */
  heldAgent(id: string): AgentClient | undefined {
    const rec = this.ctx.records.get(id);
    const booted = rec?.booted;
    return booted && !booted.agent.isClosed && !rec.phase.deleting ? booted.agent : undefined;
  }

  /** The agent of a running sandbox, for commands and files; the ledger says why there is none. */
  async agent(id: string): Promise<AgentClient> {
    const held = this.heldAgent(id);
    if (held) return held;
    const info = await this.info(id);
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
   * Runs `body` as the sandbox's `snapshot` operation on its actor, so no delete, sleep, wake or
   * stop runs meanwhile (and it changes no state). A running sandbox comes with its agent; a
   * stopped one (gVisor's sleep) with none, its disk at rest; any other state is refused.
   */
  async forSnapshot<T>(id: string, body: (subject: SnapshotSubject) => Promise<T>): Promise<T> {
    await this.info(id);
    return this.ctx.actor.run(id, "snapshot", async (_move, rec) => {
      const row = await this.ctx.ledger.getSandbox(id);
      if (!row) throw new BothyError("sandbox_not_found", `No sandbox ${id}; list them with GET /sandboxes.`);
      const booted = rec.booted;
      const running = row.state === "running" && booted !== undefined && !booted.agent.isClosed;
      if (!running && row.state !== "stopped")
        throw new BothyError(
          "sandbox_not_running",
          `Sandbox ${id} is ${row.state}; a snapshot is taken of a running or asleep sandbox.`,
        );
      return body({
        row,
        dir: this.ctx.dirFor(id),
        driver: this.ctx.drivers.get(row.driver),
        ...(running ? { agent: booted.agent, handle: booted.handle } : {}),
      });
    });
  }

  /** Starts filling the warm pool for its configured shapes (BOTHY_POOL_SHAPES), or those of one template. */
  warm(templateName?: string): Promise<void> {
    return this.creates.warm(templateName);
  }

  /** Boots `count` sandboxes from a snapshot ahead of creates from it (SandboxCreates.warmSnapshot). */
  warmSnapshot(
    snapshot: SnapshotRow,
    size: { vcpu: number; memoryMib: number; diskMib: number; maxProcesses: number },
    count: number,
  ): Promise<void> {
    return this.creates.warmSnapshot(snapshot, size, count);
  }

  /** Gives up a snapshot's pool sandboxes; resolves once they are destroyed (their mounts of its layer gone). */
  dropSnapshotPool(snapshotId: string): Promise<void> {
    return this.pool.dropSnapshot(snapshotId);
  }

  /** Sandboxes booted from a snapshot and ready for a create from it. */
  snapshotPoolReady(snapshotId: string): number {
    return this.pool.snapshotReady(snapshotId);
  }

  /** The warm pool's sandboxes: booted and waiting for a claim, and booting. */
  poolStats(): { ready: number; booting: number } {
    return this.pool.stats();
  }

  create(body: unknown, idempotencyKey: string | undefined, owner?: CreateOwner): Promise<CreateResult> {
    return this.creates.create(body, idempotencyKey, owner);
  }

  /** The sandbox now expires `timeout_s` (from the body) seconds from now, sooner or later than before. */
  async setTimeout(id: string, body: unknown): Promise<SandboxInfo> {
    const info = await this.info(id);
    const timeoutS = parseSetTimeout(body, this.ctx.config.lifecycle.maxTimeoutS);
    if (!isIn("active", info.state)) {
      throw new BothyError("sandbox_not_running", `Sandbox ${id} is ${info.state}; only a live sandbox has a timeout.`);
    }
    // Its expires_at is now the end of its retention, which a timeout must not move on for ever.
    if (isIn("dormant", info.state) && (await this.ctx.ledger.lifecycle.of(id))?.asleep_by === "timeout") {
      throw new BothyError(
        "sandbox_asleep",
        `Sandbox ${id} is asleep since its timeout passed; wake it (POST /sandboxes/${id}/resume, or any call unless it has auto_wake false) to give it a new timeout.`,
      );
    }
    const expiresAt = expiryFrom(timeoutS);
    await this.ctx.ledger.setExpiresAt(id, expiresAt);
    // Also what a wake after its timeout gives it again.
    await this.ctx.ledger.lifecycle.setTimeoutS(id, timeoutS);
    this.ctx.log("sandbox_timeout_set", { sandbox_id: id, timeout_s: timeoutS, expires_at: expiresAt });
    return this.info(id);
  }

  /**
   * Saves a sandbox's memory to disk and stops its VM (QEMU only). Its files and background
   * processes come back with `resume`; commands attached at the time end. `memory: false` lets a
   * driver that cannot keep memory (gVisor) stop it with its files kept instead.
   */
  pause(id: string, how: { memory?: boolean } = {}): Promise<SandboxInfo> {
    return this.sleepWake.pause(id, how);
  }

  /**
   * Puts an idle sandbox to sleep: paused where the driver saves memory (QEMU), else stopped with
   * its disk kept (gVisor). Either way the next call wakes it. `stillIdle` is asked again right
   * before the sandbox is let go (after the operations queued before it and the disk flush): a
   * command or call that came meanwhile keeps it running.
   */
  sleep(id: string, stillIdle: () => boolean = () => true): Promise<SandboxInfo> {
    return this.sleepWake.sleep(id, stillIdle);
  }

  resume(id: string): Promise<SandboxInfo> {
    return this.sleepWake.resume(id);
  }

  /**
   * Wakes a paused or stopped sandbox first, so commands and file calls need not know about sleep.
   * `by`: `implicit` (the default) for a call that needs it running, which is refused (409
   * `sandbox_asleep`) when the sandbox was made with `auto_wake: false` and sleeps since its timeout
   * or a pause; `resume` for an explicit wake (E2B's connect).
   */
  ensureRunning(id: string, by: WakeBy = "implicit"): Promise<SandboxInfo> {
    return this.sleepWake.ensureRunning(id, by);
  }

  /** Its timeout passed and its create asked for `on_timeout: "sleep"`: asleep until a wake, deleted at its final deadline. */
  sleepOnTimeout(id: string): Promise<SandboxInfo> {
    return this.sleepWake.sleepOnTimeout(id);
  }

  /**
   * Deletes a sandbox, off the caller's clock: the answer comes as soon as it is `deleting` and
   * can no longer be reached; its teardown goes on in the background and ends in `deleted`
   * (sandbox-deletes.ts). Idempotent. With `wait`, the answer comes once the teardown has ended.
   */
  delete(id: string, reason?: string, how?: { wait?: boolean }): Promise<SandboxInfo> {
    return this.deletes.delete(id, reason, how);
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

  /** Notes activity on a sandbox: idle sleep counts from the last one. */
  touch(id: string): void {
    this.ctx.touch(id);
  }

  /** A command in the sandbox has ended: activity, and a claim from the warm pool has had its first use. */
  commandEnded(id: string): void {
    this.pool.settled(id);
    this.touch(id);
  }

  /** Forgets the activity of sandboxes that are no longer live. */
  pruneActivity(live: ReadonlySet<string>): void {
    for (const rec of this.ctx.records.all()) {
      if (live.has(rec.id) || rec.lastActive === undefined) continue;
      rec.lastActive = undefined;
      this.ctx.records.tidy(rec);
    }
  }

  /**
   * Milliseconds since a sandbox held here was last used (created, woken, called, or a command
   * ended: each notes it in memory); 0 for one with no note.
   */
  idleFor(id: string): number {
    const last = this.ctx.records.get(id)?.lastActive;
    return last === undefined ? 0 : Date.now() - last;
  }

  /**
   * Whether the sandbox is running, no API call holds it, and nothing else is changing its state;
   * `inSleepsTurn`: asked by the sleep in flight on the sandbox's actor, whose own place in the
   * queue does not count.
   */
  canSleep(id: string, inSleepsTurn = false): boolean {
    const rec = this.ctx.records.get(id);
    // Held with its agent open is running (a pause closes the agent): asked from memory, so a
    // sleep's last check and its stop run in one turn.
    return (
      rec?.booted !== undefined &&
      !rec.booted.agent.isClosed &&
      (rec.phase.queue === undefined || inSleepsTurn) &&
      !rec.phase.deleting &&
      rec.holds === 0
    );
  }

  /**
   * Start-up recovery, after a clean stop or a crash at any moment (sandbox-recovery.ts): running
   * sandboxes are taken over or stopped, half-made ones fail, deletes in flight complete, and
   * host objects no row owns are removed.
   */
  reconcile(): Promise<void> {
    return this.recovery.reconcile();
  }

  /**
   * Completes every delete no operation of this process is carrying out: one a crash cut short
   * (at start-up) or whose teardown failed (the sweeper tries again each pass).
   */
  finishDeletes(reason: string): Promise<void> {
    return this.deletes.finishDeletes(reason);
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

  /** Paused or stopped sandboxes without a handle in this process: their disk is theirs, nothing else. */
  dormantIds(): Promise<Set<string>> {
    return this.recovery.dormantIds();
  }

  /**
   * Host objects by sandbox that this server does not answer for: everything of an id with no
   * live handle or row, and, of a paused or stopped sandbox, all but its disk.
   */
  unowned(objects: readonly HostObject[]): Promise<Map<string, HostObject[]>> {
    return this.recovery.unowned(objects);
  }

  /** Removes what `unowned` found of one sandbox, unless it was taken since; a dormant sandbox keeps its disk. */
  removeUnowned(id: string, found: readonly HostObject[], by: string): Promise<void> {
    return this.recovery.removeUnowned(id, found, by);
  }

  /** Live ledger rows that no sandbox in this process stands behind become `failed` (dormant ones need none). */
  closeUnownedRows(reason: string): Promise<string[]> {
    return this.recovery.closeUnownedRows(reason);
  }

  /**
   * The sweeper's double-check of deaths the driver's `wait()` should have reported: a running
   * sandbox of `before` whose agent channel has closed, or of which the drivers found nothing on
   * the host, is handled as dead.
   */
  checkAlive(before: ReadonlySet<string>, onHost: ReadonlySet<string>): Promise<string[]> {
    return this.recovery.checkAlive(before, onHost);
  }

  /**
   * Stops every sandbox, keeping its disk: after a restart the next call to it starts it again
   * (a paused one keeps its saved memory too).
   */
  async close(): Promise<void> {
    this.ctx.stopping = true;
    // The operations in flight end first (new creates and wakes are refused from here on).
    await Promise.allSettled(this.ctx.records.all().map((r) => r.phase.queue));
    await this.pool.close();
    await Promise.allSettled(
      this.ctx.records.held().map((rec) =>
        this.ctx.actor.run(rec.id, "stop", async (move) => {
          const { id, booted } = rec;
          if (!booted) return;
          if ((await this.ctx.ledger.getSandbox(id))?.state === "paused") {
            this.ctx.records.letGo(rec); // its VM ended at pause; the saved memory stays with the disk
            return;
          }
          // False when it died meanwhile: its death was told instead.
          const stopped = await this.held.stopOnPurpose(
            id,
            booted,
            move,
            "The server stopped; its files are kept and the next call after a restart starts it again.",
            new BothyError("shutting_down", "The server is stopping."),
          );
          if (stopped) this.ctx.log("sandbox_stopped", { sandbox_id: id });
        }),
      ),
    );
    await Promise.allSettled(this.ctx.records.all().flatMap((r) => [r.phase.deleting?.done, r.phase.reaping]));
  }
}
