import { BothyError, type SandboxState } from "@bothy/protocol";
import type { Logger } from "../events/server-events.ts";
import { describeCauses } from "../errors/internal-errors.ts";
import type { Ledger } from "../ledger/ledger.ts";
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

/** The operation in flight on one sandbox, or none. */
export type Phase = { readonly op: "idle" } | { readonly op: QueuedOp; readonly done: Promise<unknown> };

export const IDLE: Phase = { op: "idle" };

/** An operation's one power over its sandbox's row: a move along the lifecycle table, while it runs. */
export type Move = (from: SandboxState, to: SandboxState, reason?: string) => void;

/** A sandbox reached `deleted` or `failed`: whatever was kept beside its row goes. */
export type FinalListener = (sandboxId: string, state: SandboxState) => void;

/** The one ledger write the actor needs; only this file holds it (test/actor-only.unit.test.ts). */
export type StateWriter = Pick<Ledger, "transition">;

/**
 * The per-sandbox actor: every change of a sandbox's state goes through `run` (queued) or `now`
 * (pre-empting), and nowhere else calls `Ledger.transition`. It keeps the phase of each record
 * (the queued operation in flight), and when a move lands in a final state it tells the
 * `sandbox_final` listeners, which drop the side state kept for the sandbox (command records and
 * replay buffers, E2B rows, the warm pool's bookkeeping).
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
          if (rec.phase.op !== "idle" && rec.phase.done === done) rec.phase = IDLE;
        });
      rec.phase = { op, done };
      return done;
    };
    const previous = rec.tail;
    // The first operation on an idle sandbox starts in this turn: a create is counted against the
    // host's limit (and a delete marked) before anything else can run.
    const job = previous === undefined ? start() : previous.catch(() => undefined).then(start);
    rec.tail = job;
    return job.finally(() => {
      if (rec.tail === job) rec.tail = undefined;
      this.records.tidy(rec);
    });
  }

  /** Runs a pre-empting `op` now, whatever is in flight; its moves are allowed only during the call. */
  now<T>(id: string, _op: PreemptingOp, body: (move: Move) => T): T {
    const scope = this.scope(id);
    try {
      return body(scope.move);
    } finally {
      scope.end();
    }
  }

  /** A move for sandbox `id` that works until `end`, and announces a final state. */
  private scope(id: string): { move: Move; end: () => void } {
    let open = true;
    const move: Move = (from, to, reason) => {
      if (!open)
        throw new BothyError("internal", `Sandbox ${id}: an operation moved it ${from} -> ${to} after it ended.`);
      this.ledger.transition(id, from, to, reason);
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
