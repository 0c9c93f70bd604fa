import { BothyError, SANDBOX_STATES, type SandboxInfo } from "@bothy/protocol";
import { describeCauses } from "../errors/internal-errors.ts";
import { isIn, TransitionError } from "./lifecycle.ts";
import type { ManagerContext } from "./manager-context.ts";
import type { DeleteJob, Move } from "./sandbox-actor.ts";

/**
 * Deletes, answered as soon as the sandbox is `deleting` and unreachable, its teardown carried on
 * in the background; and the deletes a crash or a failed teardown left to finish.
 */
export class SandboxDeletes {
  constructor(private readonly ctx: ManagerContext) {}

  /**
   * Deletes a sandbox, off the caller's clock: the answer comes as soon as it is `deleting` and
   * can no longer be reached (its agent closed, its handle let go, so commands, files, ports and
   * sockets refuse it); its teardown goes on in the background and ends in `deleted` (the
   * `sandbox_deleted` event). A create or pause/resume in flight ends first. Idempotent: a delete
   * under way answers with the same sandbox. `reason` is logged: "requested", or who else asked
   * (the sweeper, a dropped client). With `wait`, the answer comes once the teardown has ended
   * (`deleted`, or still `deleting` when it failed and the sweeper will finish it).
   */
  async delete(id: string, reason = "requested", how: { wait?: boolean } = {}): Promise<SandboxInfo> {
    const info = await this.ctx.info(id);
    if (isIn("final", info.state)) return info;
    const job = this.deleteJob(id, reason);
    const answer = await job.answered;
    if (!how.wait) return answer;
    await job.done;
    return this.ctx.info(id);
  }

  /**
   * The delete of `id`, started if none is under way: one queued operation of the sandbox's actor
   * (after the create, pause, resume, sleep or wake before it), answered once it has marked the
   * row. A row already `deleting` (a teardown that a crash cut short or that failed) goes straight
   * to the teardown. The operation stays in flight until the teardown has ended, so the sweeper
   * never races it for the sandbox's host objects.
   */
  private deleteJob(id: string, reason: string): DeleteJob {
    const rec = this.ctx.records.of(id);
    if (rec.phase.deleting) return rec.phase.deleting;
    let marked!: { resolve: () => void; reject: (err: unknown) => void };
    const answered = new Promise<void>((resolve, reject) => (marked = { resolve, reject }));
    const done = this.ctx.actor
      .run(id, "delete", async (move) => {
        try {
          if (!(await this.mark(id, move))) return marked.resolve();
          const booted = this.ctx.records.letGo(rec);
          booted?.agent.close(new BothyError("sandbox_not_running", "The sandbox was deleted."));
          marked.resolve();
          // The answer goes out first: spawning the teardown's host commands costs the event loop
          // milliseconds that are not the caller's.
          await new Promise((resolve) => setImmediate(resolve));
          // A stop under way (the sandbox had died or gone to sleep) ends before its objects are removed.
          await rec.phase.reaping;
          if (booted) await booted.handle.destroy();
          else await this.ctx.drivers.removeOrphan(id);
          await move("deleting", "deleted");
          this.ctx.log("sandbox_deleted", { sandbox_id: id, reason });
        } catch (err) {
          marked.reject(err); // no-op once answered
          throw err;
        }
      })
      // Left `deleting`: the sweeper's next pass (or a restart) finishes it.
      .catch((err: unknown) => this.ctx.log("sandbox_delete_failed", { sandbox_id: id, error: describeCauses(err) }));
    const job = { answered: answered.then(() => this.ctx.info(id)), done };
    job.answered.catch(() => undefined); // a caller that waits only for `done` has its failure logged
    return this.ctx.actor.deleting(rec, job);
  }

  /**
   * Moves the row to `deleting` from whatever state it is in; false when it is final already.
   * A death or the sweeper (pre-empting, sandbox-actor.ts) may move the row between the read and
   * the write: the move is then asked again from the state the refusal names, as often as the
   * table allows moves (each refusal means the row moved on along it).
   */
  private async mark(id: string, move: Move): Promise<boolean> {
    let state = (await this.ctx.ledger.getSandbox(id))?.state;
    for (let tries = 0; ; tries++) {
      if (state === undefined || isIn("final", state)) return false;
      if (state === "deleting") return true;
      try {
        await move(state, "deleting");
        return true;
      } catch (err) {
        if (!(err instanceof TransitionError) || err.kind !== "stale" || tries >= SANDBOX_STATES.length) throw err;
        state = err.actual;
      }
    }
  }

  /**
   * Completes every delete no operation of this process is carrying out: one a crash cut short
   * (at start-up) or whose teardown failed (the sweeper tries again each pass).
   */
  async finishDeletes(reason: string): Promise<void> {
    const owned = this.ctx.ownedIds();
    for (const row of await this.ctx.ledger.liveSandboxes()) {
      if (row.state !== "deleting" || owned.has(row.id)) continue;
      await this.deleteJob(row.id, reason).done;
    }
  }
}
