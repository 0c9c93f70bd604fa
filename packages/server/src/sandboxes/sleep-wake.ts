import { BothyError, type NetworkPolicy, type SandboxInfo } from "@bothy/protocol";
import { describeCauses, toResumeFailure, toWakeFailure } from "../errors/internal-errors.ts";
import { needsGateway } from "../gateway/host-policy.ts";
import type { SandboxRow } from "../ledger/ledger.ts";
import { egressFromRequest } from "../network/egress-policy.ts";
import { bootSandbox, resumeSandbox, type BootedSandbox } from "./boot.ts";
import type { HeldSandboxes } from "./held-sandboxes.ts";
import { isIn } from "./lifecycle.ts";
import { expiryFrom } from "./lifetime.ts";
import type { ManagerContext } from "./manager-context.ts";
import type { Move } from "./sandbox-actor.ts";
import type { SandboxRecord } from "./sandbox-records.ts";

/** How a wake was asked for: `implicit` by a call that needs the sandbox running, else by a resume (E2B: connect). */
export type WakeBy = "implicit" | "resume";

/**
 * Pause and sleep, resume and wake: queued operations of the sandbox's actor, each checking that
 * the sandbox it was asked about is still the one held. A wake boots a dormant sandbox again
 * from its row (`bootFromDisk`), which start-up reconcile also uses to take one over.
 *
 * A sandbox whose create asked for `on_timeout: "sleep"` goes to sleep at its timeout instead of
 * being deleted (`sleepOnTimeout`), and its `expires_at` becomes its final deadline. One made with
 * `auto_wake: false` that sleeps since its timeout or a pause is woken only by a resume: an
 * implicit wake is refused with `sandbox_asleep`, checked before the wake is queued and again in
 * its turn (a timeout's sleep may have been queued ahead of it).
 */
export class SleepWake {
  constructor(
    private readonly ctx: ManagerContext,
    private readonly held: HeldSandboxes,
  ) {}

  /**
   * Saves a sandbox's memory to disk and stops its VM (QEMU only). Its files and background
   * processes come back with `resume`; commands attached at the time end. `memory: false` (E2B's
   * `pause({keepMemory: false})`) on a driver that cannot keep memory (gVisor) stops it with its
   * disk kept instead, as its sleep does: files come back, processes do not.
   */
  async pause(id: string, how: { memory?: boolean } = {}): Promise<SandboxInfo> {
    const step = async (booted: BootedSandbox, move: Move): Promise<void> => {
      if ((await this.ctx.info(id)).state === "paused") return;
      if (booted.handle.pause) await this.pauseHeld(id, booted, move);
      else if (how.memory === false) {
        const stopped = await this.held.stopOnPurpose(
          id,
          booted,
          move,
          "Paused with its files only; a resume (or a call, unless auto_wake is false) starts it again.",
          new BothyError("sandbox_not_running", "The sandbox was paused."),
        );
        if (!stopped) return;
        this.ctx.log("sandbox_paused", { sandbox_id: id });
      } else
        throw new BothyError(
          "not_supported",
          `The ${(await this.ctx.info(id)).driver} driver cannot keep a sandbox's memory; pause it with its files only (E2B: pause({keepMemory: false})), or create it with "driver": "qemu".`,
        );
      await this.ctx.ledger.lifecycle.setAsleepBy(id, "pause");
    };
    // Paused with no VM (a restart came between the pause and now): nothing to pause, unless a
    // wake already under way has it running by this pause's turn.
    if ((await this.ctx.info(id)).state === "paused" && !this.ctx.records.get(id)?.booted) {
      return this.serialized(id, "pause", async (move, rec) => {
        if (rec.booted && !rec.phase.deleting) await step(rec.booted, move);
      });
    }
    return this.onHeld(id, "pause", step);
  }

  private async pauseHeld(id: string, booted: BootedSandbox, move: Move): Promise<void> {
    booted.agent.close(new BothyError("sandbox_not_running", "The sandbox was paused."));
    await booted.handle.pause?.();
    await this.ctx.ledger.loseCommands(id);
    await move("running", "paused");
    this.ctx.log("sandbox_paused", { sandbox_id: id });
  }

  /**
   * Puts an idle sandbox to sleep: paused where the driver saves memory (QEMU), else stopped with
   * its disk kept (gVisor). Either way the next call wakes it.
   */
  sleep(id: string, stillIdle: () => boolean): Promise<SandboxInfo> {
    return this.onHeld(id, "sleep", async (booted, move) => {
      if ((await this.ctx.info(id)).state !== "running" || !stillIdle()) return;
      if (booted.handle.pause) return this.pauseHeld(id, booted, move);
      const stopped = await this.held.stopOnPurpose(
        id,
        booted,
        move,
        "Asleep after being idle; the next call starts it again.",
        new BothyError("sandbox_not_running", "The sandbox went to sleep."),
        stillIdle,
      );
      if (stopped) this.ctx.log("sandbox_slept", { sandbox_id: id });
    });
  }

  /**
   * Puts a sandbox whose timeout has passed to sleep instead of deleting it (`on_timeout: "sleep"`):
   * as an idle sleep does, but whatever runs in it (its time is up, as a delete would end it too).
   * One that sleeps already stays asleep. Either way it is then deleted
   * `BOTHY_SLEEP_RETENTION_S` later unless a wake comes first; a wake gives it its timeout again.
   */
  sleepOnTimeout(id: string): Promise<SandboxInfo> {
    return this.serialized(id, "sleep", async (move, rec) => {
      const row = await this.ctx.ledger.getSandbox(id);
      // Its timeout was moved on (a connect, a set-timeout) while this waited for its turn.
      if (!row || row.expires_at === null || Date.parse(row.expires_at) > Date.now()) return;
      if (rec.phase.deleting || !isIn("expirable", row.state)) return;
      if (row.state === "running") {
        const booted = rec.booted;
        if (!booted) return; // nothing held behind the row: the sweeper's death checks close it
        if (booted.handle.pause) await this.pauseHeld(id, booted, move);
        else {
          const stopped = await this.held.stopOnPurpose(
            id,
            booted,
            move,
            "Asleep after its timeout; a call (or a resume, with auto_wake false) starts it again.",
            new BothyError("sandbox_not_running", "The sandbox's timeout passed: it went to sleep."),
          );
          if (!stopped) return;
        }
      }
      const finalAt = expiryFrom(this.ctx.config.lifecycle.sleepRetentionS);
      await this.ctx.ledger.lifecycle.setAsleepBy(id, "timeout");
      await this.ctx.ledger.setExpiresAt(id, finalAt);
      const { state } = await this.ctx.info(id);
      this.ctx.log("sandbox_timed_out", { sandbox_id: id, state, deleted_after: finalAt });
    });
  }

  /**
   * The refusal of an implicit wake of a sandbox only a resume may wake: made with `auto_wake:
   * false`, asleep since its timeout or a pause. Undefined when a call may wake it.
   */
  async wakeRefusal(id: string): Promise<BothyError | undefined> {
    const lifecycle = await this.ctx.ledger.lifecycle.of(id);
    if (!lifecycle || lifecycle.auto_wake === 1 || lifecycle.asleep_by === null) return undefined;
    const since = lifecycle.asleep_by === "timeout" ? "its timeout passed" : "it was paused";
    return new BothyError(
      "sandbox_asleep",
      `Sandbox ${id} is asleep since ${since}, and it was created with auto_wake false: calls do not wake it. Wake it with POST /sandboxes/${id}/resume (E2B: Sandbox.connect), then call again.`,
      { details: { sandbox_id: id, asleep_by: lifecycle.asleep_by } },
    );
  }

  /** A wake happened: what put it to sleep is over, and one asleep since its timeout gets its timeout again. */
  private async woke(id: string): Promise<void> {
    const lifecycle = await this.ctx.ledger.lifecycle.of(id);
    if (!lifecycle?.asleep_by) return;
    await this.ctx.ledger.lifecycle.setAsleepBy(id, null);
    if (lifecycle.asleep_by === "timeout") await this.ctx.ledger.setExpiresAt(id, expiryFrom(lifecycle.timeout_s));
  }

  async resume(id: string, by: WakeBy = "resume"): Promise<SandboxInfo> {
    const { state } = await this.ctx.info(id);
    if (state === "stopped" || (state === "paused" && !this.ctx.records.get(id)?.booted)) return this.revive(id, by);
    return this.onHeld(id, "resume", async (booted, move, rec) => {
      const now = await this.ctx.info(id);
      if (now.state !== "paused") return;
      const refusal = by === "implicit" ? await this.wakeRefusal(id) : undefined;
      if (refusal) throw refusal;
      try {
        await resumeSandbox(this.ctx.drivers.get(now.driver), booted, this.ctx.config.bootTimeoutMs);
      } catch (err) {
        // A sandbox that cannot come back is over: its state file and disk go with it. The row
        // says so first (as a delete marks `deleting` before its teardown), so a crash or a
        // failed removal can leave host objects behind (the sweeper's to remove) but never a
        // `paused` row with nothing behind it.
        const e = toResumeFailure(err);
        this.ctx.records.letGo(rec);
        await move("paused", "failed", e.message);
        this.ctx.log("sandbox_resume_failed", { sandbox_id: id, error: describeCauses(err) });
        await booted.handle
          .destroy()
          .catch((destroyErr: unknown) =>
            this.ctx.log("sandbox_delete_failed", { sandbox_id: id, error: describeCauses(destroyErr) }),
          );
        throw e;
      }
      await move("paused", "running");
      await this.woke(id);
      this.ctx.log("sandbox_resumed", { sandbox_id: id });
    });
  }

  /**
   * Wakes a paused or stopped sandbox first, so commands and file calls need not know about sleep;
   * `by: "implicit"` (a call that needs it running) is refused for a sandbox only a resume may wake.
   */
  async ensureRunning(id: string, by: WakeBy): Promise<SandboxInfo> {
    const info = await this.ctx.info(id);
    this.ctx.touch(id);
    if (!isIn("dormant", info.state)) return info;
    const refusal = by === "implicit" ? await this.wakeRefusal(id) : undefined;
    if (refusal) throw refusal;
    const woken = await this.resume(id, by);
    // A slow wake (a VM under emulation) must not count as idle time.
    this.ctx.touch(id);
    return woken;
  }

  /**
   * Starts a stopped sandbox again on its disk, with the same id, template build, shape and
   * network policy (a QEMU one paused before a restart comes back from its saved memory). A
   * failed start leaves it stopped with its files, and says why.
   */
  private revive(id: string, by: WakeBy): Promise<SandboxInfo> {
    return this.serialized(id, "wake", async (move, rec) => {
      const row = await this.ctx.ledger.getSandbox(id);
      if (!row || !isIn("dormant", row.state) || rec.booted) return;
      this.ctx.checkHere(row);
      const refusal = by === "implicit" ? await this.wakeRefusal(id) : undefined;
      if (refusal) throw refusal;
      await rec.phase.reaping;
      if (this.ctx.stopping || rec.phase.deleting)
        throw new BothyError("sandbox_not_running", `Sandbox ${id} is being deleted or the server is stopping.`);
      if (!this.ctx.makeRoom()) {
        throw new BothyError(
          "capacity_exhausted",
          `This host runs at most ${this.ctx.config.limits.maxSandboxes} sandboxes; delete one or raise BOTHY_MAX_SANDBOXES to wake ${id}.`,
        );
      }
      const started = Date.now();
      let memoryFailed = false;
      const booted = await this.bootFromDisk(row, {}, () => (memoryFailed = true)).catch((err: unknown) => {
        this.ctx.log("sandbox_wake_failed", { sandbox_id: id, error: describeCauses(err) });
        // Its saved memory would not restore (a restore that ran may have used it up) and the cold
        // boot failed too: what is left is its disk, and the row says so, as for any sandbox that stopped.
        const failure = toWakeFailure(id, err);
        if (memoryFailed && row.state === "paused")
          return move("paused", "stopped").then(() => Promise.reject(failure));
        throw failure;
      });
      try {
        await move(row.state, "running");
      } catch (err) {
        await booted.handle.stop();
        throw err;
      }
      this.held.adopt(booted);
      await this.woke(id);
      this.ctx.log("sandbox_woken", { sandbox_id: id, from: row.state, driver: row.driver, ms: Date.now() - started });
    });
  }

  /**
   * Boots a sandbox of the ledger again on its kept disk (with its saved memory where a pause left
   * some), or takes it over (`attach`), with the template build, shape and network policy of its row.
   */
  async bootFromDisk(
    row: SandboxRow,
    how: { attach?: boolean } = {},
    onRestoreFailed?: () => void,
  ): Promise<BootedSandbox> {
    const lookup = this.ctx.templates.resolveBuild
      ? this.ctx.templates.resolveBuild(row.template, row.template_hash)
      : this.ctx.templates.resolve(row.template);
    const template = await lookup;
    if (template?.hash !== row.template_hash)
      throw new BothyError(
        "template_not_built",
        `its template build ${row.template}@${row.template_hash.slice(0, 12)} is no longer on this host.`,
      );
    const shown = row.network ? (JSON.parse(row.network) as NetworkPolicy) : undefined;
    const egress = {
      ...egressFromRequest(
        shown ? { internet: shown.internet, allow_out: shown.allow_out, deny_out: shown.deny_out } : {},
      ),
      gateway: shown?.enabled === true && needsGateway(await this.ctx.policies.ofRow(row)),
    };
    const spec = {
      ...(await this.ctx.bootSpec(
        row.id,
        template,
        {
          vcpu: row.vcpu,
          memoryMib: row.memory_mib,
          ...(row.disk_mib === null ? {} : { diskMib: row.disk_mib }),
          maxProcesses: row.max_processes ?? this.ctx.config.limits.defaultProcesses,
        },
        egress,
      )),
      reuseDisk: true,
      ...how,
    };
    // A wake from saved memory that fails (an agent from an older bothy that does not know a frame, a
    // guest that broke its own cgroups) boots cold on the same disk: files kept, processes lost.
    return bootSandbox(this.ctx.drivers.get(row.driver), spec, this.ctx.config.bootTimeoutMs, {
      onWakeFailed: (err) => {
        onRestoreFailed?.();
        this.ctx.log("sandbox_restore_failed", { sandbox_id: row.id, error: describeCauses(err) });
      },
    });
  }

  /** Queues `step` on the sandbox held now; it fails if that sandbox was let go or is being deleted by its turn. */
  private async onHeld(
    id: string,
    op: "pause" | "resume" | "sleep",
    step: (booted: BootedSandbox, move: Move, rec: SandboxRecord) => Promise<void>,
  ): Promise<SandboxInfo> {
    const info = await this.ctx.info(id);
    const rec = this.ctx.records.get(id);
    const booted = rec?.booted;
    if (!rec || !booted || (info.state !== "running" && info.state !== "paused")) {
      throw new BothyError(
        "sandbox_not_running",
        `Sandbox ${id} is ${info.state}; only a running or paused sandbox can be paused or resumed.`,
      );
    }
    const generation = rec.generation;
    return this.serialized(id, op, async (move) => {
      if (rec.generation !== generation || rec.phase.deleting)
        throw new BothyError("sandbox_not_running", `Sandbox ${id} is being deleted or has stopped.`);
      await step(booted, move, rec);
    });
  }

  /** Queues `step` on the sandbox's actor; answers with the sandbox as it is after it. */
  private serialized(
    id: string,
    op: "pause" | "resume" | "sleep" | "wake",
    step: (move: Move, rec: SandboxRecord) => Promise<void>,
  ): Promise<SandboxInfo> {
    return this.ctx.actor.run(id, op, async (move, rec) => {
      await step(move, rec);
      return this.ctx.info(id);
    });
  }
}
