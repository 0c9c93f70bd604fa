import { BothyError } from "@bothy/protocol";
import { execQuiet } from "../agent/quiet-exec.ts";
import type { ServerEventMap } from "../events/server-events.ts";
import type { BootedSandbox } from "./boot.ts";
import type { ManagerContext } from "./manager-context.ts";
import type { Move } from "./sandbox-actor.ts";

/** How long a guest gets to write its caches to disk before a deliberate stop. */
const FLUSH_TIMEOUT_MS = 10_000;

/**
 * Taking hold of a booted sandbox (and noticing when it dies on its own) and letting go of a
 * running one: after a death, or on purpose with its disk flushed first.
 */
export class HeldSandboxes {
  constructor(private readonly ctx: ManagerContext) {}

  /**
   * Takes ownership of a booted sandbox and notices when it dies on its own: by its agent's channel
   * closing under it (the first sign: a gVisor sandbox's `runsc run` takes a while longer to end),
   * or by the driver's process ending, whichever comes first.
   */
  adopt(booted: BootedSandbox): void {
    const id = booted.spec.id;
    const rec = this.ctx.records.of(id);
    const generation = this.ctx.records.hold(rec, booted);
    const died = async (reason: string, fields: Omit<ServerEventMap["sandbox_died"], "sandbox_id">): Promise<void> => {
      const gone = (): boolean =>
        rec.generation !== generation || rec.phase.deleting !== undefined || this.ctx.stopping;
      if (gone()) return;
      // Not running: a resume is bringing it back, and its own failure handles the death.
      const state = (await this.ctx.ledger.getSandbox(id))?.state;
      if (state !== "running" || gone()) return;
      await this.lose(id, booted, reason, fields);
    };
    const report = (err: unknown): void =>
      this.ctx.log("sandbox_stop_failed", { sandbox_id: id, error: (err as Error).message });
    booted.agent.onLost((err) =>
      died("The sandbox stopped unexpectedly: its agent channel closed.", {
        reason: `its agent channel closed: ${err.message}`,
      }).catch(report),
    );
    void booted.handle
      .wait()
      .then((exit) =>
        died(`The sandbox stopped unexpectedly (code ${exit.code ?? "none"}, signal ${exit.signal ?? "none"}).`, {
          code: exit.code,
          signal: exit.signal,
        }),
      )
      .catch(report);
  }

  /**
   * A sandbox that stopped on its own (its VM or container died or was killed): `stopped`, its
   * commands lost, its host objects but the disk removed. The next call starts it again from its
   * disk with the same id. A death pre-empts the operation in flight (the actor's `now`): that
   * operation's next move finds the row changed and fails.
   */
  lose(
    id: string,
    booted: BootedSandbox,
    reason: string,
    fields: Omit<ServerEventMap["sandbox_died"], "sandbox_id">,
  ): Promise<void> {
    this.ctx.log("sandbox_died", { sandbox_id: id, ...fields });
    return this.ctx.actor.now(id, "death", (move) =>
      this.stopHeld(
        id,
        booted,
        move,
        `${reason} Its files are kept; the next call starts it again.`,
        new BothyError("agent_unavailable", "The sandbox stopped."),
      ),
    );
  }

  /**
   * Stops a sandbox on purpose (sleep, server stop): the guest writes its caches to disk first, as
   * a machine does before it powers off, so nothing written before the stop is lost. `proceed` is
   * asked after the flush, in the same turn as the stop (a sleep's: no command came meanwhile).
   * True when this call stopped it.
   */
  async stopOnPurpose(
    id: string,
    booted: BootedSandbox,
    move: Move,
    reason: string,
    closeWith: BothyError,
    proceed: () => boolean = () => true,
  ): Promise<boolean> {
    // Whether the record still holds this very sandbox, not merely whether it changed during the
    // flush: a death noticed while the caller read the ledger has let go of it before this began.
    const held = (): boolean => this.ctx.records.get(id)?.booted === booted;
    if (!held()) return false;
    await execQuiet(booted.agent, "sync", FLUSH_TIMEOUT_MS, "Flushing the disk").catch((err: unknown) =>
      this.ctx.log("sandbox_flush_failed", { sandbox_id: id, error: (err as Error).message }),
    );
    // It died or was deleted during the flush: whoever noticed has let go of it already.
    if (!held() || !proceed()) return false;
    await this.stopHeld(id, booted, move, reason, closeWith);
    return true;
  }

  /**
   * Lets go of a held sandbox: `stopped` in the ledger, its processes and network removed in the
   * background. The record lets go in the same turn as the decision to stop, before the ledger's
   * round trip: a second notice of the same death, or a sleep or stop that finished its flush
   * meanwhile, then finds it gone and stands back instead of racing this move (on PostgreSQL the
   * move is a round trip, so another turn always comes between the decision and the write).
   * The processes go even if the move fails (another node or operation moved the row): nothing
   * here holds them any more.
   */
  private async stopHeld(
    id: string,
    booted: BootedSandbox,
    move: Move,
    reason: string,
    closeWith: BothyError,
  ): Promise<void> {
    const rec = this.ctx.records.of(id);
    this.ctx.records.letGo(rec);
    booted.agent.close(closeWith);
    // What is left after a failed stop is for the sweeper's next pass.
    const reaped = this.ctx.actor.reaping(
      rec,
      booted.handle
        .stop()
        .catch((err: unknown) =>
          this.ctx.log("sandbox_stop_failed", { sandbox_id: id, error: (err as Error).message }),
        ),
    );
    await move("running", "stopped", reason);
    await this.ctx.ledger.loseCommands(id);
    return reaped;
  }
}
