import { BothyError, SANDBOX_STATES, type SandboxState } from "@bothy/protocol";

/**
 * Every state a sandbox can be in: the moves it may make from there (with the operations that
 * make them), and the sets of states queries mean, as columns. A create inserts its row as
 * `creating` (or `running` when it claims a booted sandbox from the warm pool); after that the
 * state changes only along `to`, and only through the sandbox's actor (sandbox-actor.ts).
 *
 * - `live`: it still owns host resources (a VM, a disk, a network).
 * - `dormant`: it exists but runs nothing; the next call wakes it.
 * - `active`: it exists and is not being deleted: it counts against its tenant's quota and has a timeout.
 * - `expirable`: the sweeper deletes it once `expires_at` has passed.
 * - `servable`: calls reach it (a dormant one is woken first).
 * - `final`: it is over; nothing is left of it but its row.
 */
export const LIFECYCLE = {
  creating: {
    to: {
      running: ["boot ok"],
      failed: ["boot failed", "restart found it half-made", "sweeper found nothing behind it"],
    },
    live: true,
    dormant: false,
    active: true,
    expirable: false,
    servable: false,
    final: false,
  },
  running: {
    to: {
      paused: ["pause", "sleep (driver can pause)"],
      stopped: ["died", "sleep (driver cannot pause)", "server stop", "restart could not take it over"],
      deleting: ["delete begins"],
      failed: ["sweeper found nothing behind it"],
    },
    live: true,
    dormant: false,
    active: true,
    expirable: true,
    servable: true,
    final: false,
  },
  paused: {
    to: {
      running: ["resume", "wake"],
      stopped: ["wake: its saved memory failed to restore and the cold boot on its disk failed too"],
      deleting: ["delete begins"],
      failed: ["resume failed"],
    },
    live: true,
    dormant: true,
    active: true,
    expirable: true,
    servable: true,
    final: false,
  },
  stopped: {
    to: {
      running: ["wake"],
      deleting: ["delete begins"],
    },
    live: true,
    dormant: true,
    active: true,
    expirable: true,
    servable: true,
    final: false,
  },
  deleting: {
    to: {
      deleted: ["delete ends", "restart or sweeper completes the delete"],
    },
    live: true,
    dormant: false,
    active: false,
    expirable: false,
    servable: false,
    final: false,
  },
  deleted: { to: {}, live: false, dormant: false, active: false, expirable: false, servable: false, final: true },
  failed: { to: {}, live: false, dormant: false, active: false, expirable: false, servable: false, final: true },
} as const satisfies Record<
  SandboxState,
  { to: Partial<Record<SandboxState, readonly string[]>> } & Record<StateSet, boolean>
>;

/** The named sets of states, each a column of LIFECYCLE. */
export type StateSet = "live" | "dormant" | "active" | "expirable" | "servable" | "final";

/** The states of one set, in SANDBOX_STATES order. */
export function statesIn(set: StateSet): readonly SandboxState[] {
  return SANDBOX_STATES.filter((s) => LIFECYCLE[s][set]);
}

/** Whether `state` is in `set`. */
export function isIn(set: StateSet, state: SandboxState): boolean {
  return LIFECYCLE[state][set];
}

/**
 * The states of a set as an SQL list (`'running', 'paused'`), for `state IN (...)`. Built only
 * from the table's own state names (never from input), so it is safe to put in the statement,
 * and the statement stays one the statement cache can keep.
 */
export function sqlStates(set: StateSet): string {
  return statesIn(set)
    .map((s) => `'${s}'`)
    .join(", ");
}

/** The states a row may be inserted with. */
export const INITIAL_STATES: readonly SandboxState[] = ["creating", "running"];

export function canTransition(from: SandboxState, to: SandboxState): boolean {
  return to in LIFECYCLE[from].to;
}

/**
 * A state change the ledger refused: `illegal` when the table has no such move (a bug), `stale`
 * when the sandbox was no longer in the state the caller read (another operation moved it first).
 */
export class TransitionError extends BothyError {
  constructor(
    readonly kind: "illegal" | "stale",
    readonly sandboxId: string,
    readonly from: SandboxState,
    readonly to: SandboxState,
    /** The state the row had when refused; undefined when there is no row. */
    readonly actual: SandboxState | undefined,
  ) {
    super(
      kind === "illegal" ? "internal" : actual === undefined ? "sandbox_not_found" : "sandbox_not_running",
      kind === "illegal"
        ? `Sandbox ${sandboxId} cannot move from ${from} to ${to}.`
        : `Sandbox ${sandboxId} is ${actual ?? "gone"}, not ${from}: another operation changed it first; retry.`,
      { details: { sandbox_id: sandboxId, from, to, actual: actual ?? null } },
    );
  }
}
