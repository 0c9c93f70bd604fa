import { BothyError, type SandboxInfo, type SandboxState } from "@bothy/protocol";
import type { Logger } from "../events/server-events.ts";
import { describeCauses } from "../errors/internal-errors.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { isIn } from "./lifecycle.ts";
import type { SandboxRecord, SandboxRecords } from "./sandbox-records.ts";

/**
 * What changes a sandbox's state. Queued operations run one at a time per sandbox, in the order
 * asked; pre-empting ones (a death noticed, the sweeper closing a row nothing stands behind) run
 * at once, even while a queued one is in flight: that one's next move then finds the row changed
 * (compare-and-set) and fails, as it must.
 */
export type QueuedOp =
  "create" | "pause" | "resume" | "sleep" | "wake" | "delete" | "stop" | "reconcile" | "takeover" | "snapshot";
export type PreemptingOp = "death" | "sweep";
export type SandboxOp = QueuedOp | PreemptingOp;

/** The queued operation in flight on one sandbox, or none. */
export type InFlight = { readonly op: "idle" } | { readonly op: QueuedOp; readonly done: Promise<unknown> };

/** A sandbox's delete, queued or in flight: `answered` once it is `deleting` and unreachable, `done` once its teardown has ended. */
export interface DeleteJob {
  readonly answered: Promise<SandboxInfo>;
  readonly done: Promise<void>;
}

/** What goes on around the operation in flight; each is undefined when nothing of the kind is under way. */
export interface Underway {
  /** The last operation queued: the next one starts when it ends. */
  readonly queue: Promise<unknown> | undefined;
  /** Its delete (sandbox-deletes.ts): a second delete joins it instead of queueing another. */
  readonly deleting: DeleteJob | undefined;
  /** Its processes and network being released after it stopped (the disk stays; held-sandboxes.ts). */
  readonly reaping: Promise<void> | undefined;
}

/**
 * Everything under way on one sandbox, in one typed value that only this file sets: the record
 * beside it holds no promise of its own (test/actor-only.unit.test.ts checks both).
 */
export type Phase = InFlight & Underway;

export const IDLE: Phase = { op: "idle", queue: undefined, deleting: undefined, reaping: undefined };

/**
 * An operation's one power over its sandbox's row: a move along the lifecycle table, while it runs.
 * It resolves once the ledger holds the new state (and the final-state listeners have run); it
 * rejects when the row was not in `from` (the store's compare-and-set: another operation, a
 * pre-empting one or one on another node, moved it first).
 */
export type Move = (from: SandboxState, to: SandboxState, reason?: string) => Promise<void>;

/** A sandbox reached `deleted` or `failed`: whatever was kept beside its row goes. */
export type FinalListener = (sandboxId: string, state: SandboxState) => void;

/** The one ledger write the actor needs; only this file holds it (test/actor-only.unit.test.ts). */
export type StateWriter = Pick<LedgerStore, "transition">;

/**
 * The per-sandbox actor: the one place where a sandbox's state changes. Every move of a row along
 * the lifecycle table (lifecycle.ts: the states, the moves each allows and the operations that
 * make them) goes through `run` (queued) or `now` (pre-empting), and nowhere else calls
 * `LedgerStore.transition`; every change of a record's phase (the operation in flight, the queue, a
 * delete or a stop's teardown under way) happens here too. When a move lands in a final state it
 * tells the `sandbox_final` listeners, which drop the side state kept for the sandbox (command
 * records and replay buffers, E2B rows, the warm pool's bookkeeping). The operations themselves
 * live beside it: creates (sandbox-creates.ts), deletes (sandbox-deletes.ts), sleep, wake, pause
 * and resume (sleep-wake.ts), deaths and stops (held-sandboxes.ts), start-up recovery
 * (sandbox-recovery.ts).
 */
export class SandboxActor {
  private readonly finalListeners: FinalListener[] = [];

  constructor(
    private readonly records: SandboxRecords,
    private readonly ledger: StateWriter,
    private readonly log: Logger,
  ) {}

  /** Subscribes to `sandbox_final`; listeners run synchronously, in order, right after the move. */
  onFinal(listener: FinalListener): void {
    this.finalListeners.push(listener);
  }

  /**
   * Runs `op` on sandbox `id` once the operations queued before it have ended (at once, in this
   * turn, when none is), with the record's phase naming it while it runs.
   */
  run<T>(id: string, op: QueuedOp, body: (move: Move, rec: SandboxRecord) => Promise<T>): Promise<T> {
    const rec = this.records.of(id);
    const start = (): Promise<T> => {
      if (rec.phase.op !== "idle")
        throw new BothyError("internal", `Sandbox ${id}: ${op} started while ${rec.phase.op} was in flight.`);
      const scope = this.scope(id);
      const done = Promise.resolve()
        .then(() => body(scope.move, rec))
        .finally(() => {
          scope.end();
          if (rec.phase.op !== "idle" && rec.phase.done === done) rec.phase = { ...underway(rec.phase), op: "idle" };
        });
      rec.phase = { ...underway(rec.phase), op, done };
      return done;
    };
    const previous = rec.phase.queue;
    // The first operation on an idle sandbox starts in this turn: a create is counted against the
    // host's limit (and a delete marked) before anything else can run.
    const job = previous === undefined ? start() : previous.catch(() => undefined).then(start);
    this.note(rec, { queue: job });
    return job.finally(() => {
      if (rec.phase.queue === job) this.note(rec, { queue: undefined });
      this.records.tidy(rec);
    });
  }

  /**
   * Notes `job` as the sandbox's delete until its teardown has ended (sandbox-deletes.ts queues
   * the operation itself); returns the job whose `done` ends once the note is gone.
   */
  deleting(rec: SandboxRecord, job: DeleteJob): DeleteJob {
    const done = job.done.finally(() => {
      if (rec.phase.deleting === noted) this.note(rec, { deleting: undefined });
      this.records.tidy(rec);
    });
    const noted: DeleteJob = { answered: job.answered, done };
    this.note(rec, { deleting: noted });
    return noted;
  }

  /**
   * Notes a stopped sandbox's teardown (its processes and network; held-sandboxes.ts) while it
   * runs; `job` must not reject. Returns its end, once the note is gone.
   */
  reaping(rec: SandboxRecord, job: Promise<void>): Promise<void> {
    const noted = job.finally(() => {
      if (rec.phase.reaping === noted) this.note(rec, { reaping: undefined });
      this.records.tidy(rec);
    });
    this.note(rec, { reaping: noted });
    return noted;
  }

  private note(rec: SandboxRecord, change: Partial<Underway>): void {
    rec.phase = { ...rec.phase, ...change };
  }

  /** Runs a pre-empting `op` now, whatever is in flight; its moves are allowed until `body` settles. */
  async now<T>(id: string, _op: PreemptingOp, body: (move: Move) => Promise<T>): Promise<T> {
    const scope = this.scope(id);
    try {
      return await body(scope.move);
    } finally {
      scope.end();
    }
  }

  /**
   * A move for sandbox `id` that works until `end`, and announces a final state. Whether the scope
   * is open is decided when the move is asked, before the write: a move asked in time lands even
   * if its operation's end comes while the store answers.
   */
  private scope(id: string): { move: Move; end: () => void } {
    let open = true;
    const move: Move = async (from, to, reason) => {
      if (!open)
        throw new BothyError("internal", `Sandbox ${id}: an operation moved it ${from} -> ${to} after it ended.`);
      await this.ledger.transition(id, from, to, reason);
      if (isIn("final", to)) this.announceFinal(id, to);
    };
    return { move, end: () => (open = false) };
  }

  private announceFinal(id: string, state: SandboxState): void {
    this.log("sandbox_final", { sandbox_id: id, state });
    for (const listener of this.finalListeners) {
      try {
        listener(id, state);
      } catch (err) {
        this.log("sandbox_final_cleanup_failed", { sandbox_id: id, error: describeCauses(err) });
      }
    }
  }
}

/** The part of a phase that outlives the operation in flight. */
function underway(p: Phase): Underway {
  return { queue: p.queue, deleting: p.deleting, reaping: p.reaping };
}
