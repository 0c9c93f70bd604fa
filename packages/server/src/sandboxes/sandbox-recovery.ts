import type { HostObject } from "../drivers/driver.ts";
import { describeCauses } from "../errors/internal-errors.ts";
import type { SandboxRow } from "../ledger/ledger.ts";
import type { HeldSandboxes } from "./held-sandboxes.ts";
import { isIn } from "./lifecycle.ts";
import type { ManagerContext } from "./manager-context.ts";
import type { SandboxDeletes } from "./sandbox-deletes.ts";
import type { SleepWake } from "./sleep-wake.ts";

/**
 * What a crash or a death leaves behind: start-up reconcile of the ledger with what still runs,
 * and the sweeper's questions (which host objects no sandbox owns, which rows nothing stands
 * behind, which held sandboxes died unnoticed).
 */
export class SandboxRecovery {
  constructor(
    private readonly ctx: ManagerContext,
    private readonly held: HeldSandboxes,
    private readonly sleepWake: SleepWake,
    private readonly deletes: SandboxDeletes,
  ) {}

  /**
   * Start-up recovery, after a clean stop or a crash at any moment. A running sandbox whose VM
   * outlived the old server is attached to and keeps running; other running sandboxes become
   * stopped (their processes ended with the server, or are ended now; the disk stays and the next
   * call starts them again); half-made ones fail; deletes in flight complete; paused and stopped
   * ones stay as they are. Then every host object no row owns is removed, and a dormant
   * sandbox's objects except its disk.
   */
  async reconcile(): Promise<void> {
    for (const row of await this.ctx.ledger.liveSandboxes()) {
      if (row.state === "running") {
        // Commands of the old server cannot be followed by this one; they run on in the guest, detached.
        await this.ctx.ledger.loseCommands(row.id);
        if (await this.ctx.actor.run(row.id, "takeover", () => this.attachAfterRestart(row))) continue;
        await this.ctx.actor.run(row.id, "reconcile", async (move) => {
          await move(
            "running",
            "stopped",
            "The server restarted and its processes ended; its files are kept and the next call starts it again.",
          );
          this.ctx.log("sandbox_recovered", { sandbox_id: row.id, previous_state: row.state, state: "stopped" });
        });
      } else if (row.state === "creating") {
        await this.ctx.actor.run(row.id, "reconcile", async (move) => {
          await move("creating", "failed", "The server restarted while this sandbox was being created.");
          await this.ctx.ledger.forgetIdempotencyKeysOf(row.id);
          this.ctx.log("sandbox_lost", { sandbox_id: row.id, previous_state: row.state });
        });
      }
    }
    await this.deletes.finishDeletes("completed after restart");
    const objects = (await Promise.all(this.ctx.drivers.all().map((d) => d.reconcile()))).flat();
    for (const [id, found] of await this.unowned(objects)) await this.removeUnowned(id, found, "start-up");
  }

  /**
   * Host objects by sandbox that this server does not answer for: everything of an id with no
   * live handle or row, and, of a paused or stopped sandbox, all but its disk.
   */
  async unowned(objects: readonly HostObject[]): Promise<Map<string, HostObject[]>> {
    const dormant = await this.dormantIds();
    const owned = this.ctx.ownedIds();
    const byId = new Map<string, HostObject[]>();
    for (const o of objects) {
      if (owned.has(o.sandboxId) || (dormant.has(o.sandboxId) && o.disk === true)) continue;
      byId.set(o.sandboxId, [...(byId.get(o.sandboxId) ?? []), o]);
    }
    return byId;
  }

  /** Removes what `unowned` found of one sandbox, unless it was taken since; a dormant sandbox keeps its disk. */
  async removeUnowned(id: string, found: readonly HostObject[], by: string): Promise<void> {
    const dormant = await this.dormantIds();
    if (this.ctx.ownedIds().has(id)) return;
    const keepDisk = dormant.has(id);
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
  async dormantIds(): Promise<Set<string>> {
    return new Set(
      (await this.ctx.ledger.liveSandboxes())
        .filter((r) => isIn("dormant", r.state) && this.ctx.records.get(r.id)?.booted === undefined)
        .map((r) => r.id),
    );
  }

  /** Live ledger rows that no sandbox in this process stands behind become `failed` (dormant ones need none). */
  async closeUnownedRows(reason: string): Promise<string[]> {
    const closed: string[] = [];
    for (const row of await this.ctx.ledger.liveSandboxes()) {
      // A `deleting` row is finished by finishDeletes, not failed: its host objects may still be there.
      // Ownership is asked per row, after the read: a create writes its row only once its operation is under way.
      if (this.ctx.ownedIds().has(row.id) || isIn("dormant", row.state) || row.state === "deleting") continue;
      // Nothing is in flight on it (it is not owned): the sweeper's decision pre-empts nothing.
      await this.ctx.actor.now(row.id, "sweep", (move) => move(row.state, "failed", reason));
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
  async checkAlive(before: ReadonlySet<string>, onHost: ReadonlySet<string>): Promise<string[]> {
    const dead: string[] = [];
    for (const rec of this.ctx.records.held()) {
      const { id, booted } = rec;
      if ((await this.ctx.ledger.getSandbox(id))?.state !== "running") continue;
      // Asked after the read: an operation queued or in flight decides for itself (a resume's own
      // failure handles a death), and one that let go of it meanwhile has it no longer.
      const { phase } = rec;
      if (!booted || rec.booted !== booted || !before.has(id) || phase.queue !== undefined || phase.deleting) continue;
      const why = booted.agent.isClosed
        ? "its agent channel closed"
        : !onHost.has(id)
          ? "the driver found nothing of it on the host"
          : undefined;
      if (why === undefined) continue;
      await this.held.lose(id, booted, `The sandbox stopped unexpectedly: ${why}.`, {
        detected_by: "sweeper",
        reason: why,
      });
      dead.push(id);
    }
    return dead;
  }

  /** Takes over a sandbox that still runs from before the restart; false when it cannot (then it is stopped). */
  private async attachAfterRestart(row: SandboxRow): Promise<boolean> {
    const driver = this.ctx.drivers.all().find((d) => d.name === row.driver);
    if (!driver?.attaches) return false;
    const started = Date.now();
    try {
      const booted = await this.sleepWake.bootFromDisk(row, { attach: true });
      this.held.adopt(booted);
      this.ctx.touch(row.id);
      this.ctx.log("sandbox_reattached", { sandbox_id: row.id, driver: row.driver, ms: Date.now() - started });
      return true;
    } catch (err) {
      this.ctx.log("sandbox_reattach_failed", { sandbox_id: row.id, error: describeCauses(err) });
      return false;
    }
  }
}
