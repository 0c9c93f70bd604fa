import { BothyError, type SandboxState } from "@bothy/protocol";

/**
 * Every move a sandbox's state may make, and the operations that make it. A create inserts its
 * row as `creating` (or `running` when it claims a booted sandbox from the warm pool); after that
 * the ledger changes a state only along this table (`Ledger.transition`). `deleted` and `failed`
 * are final.
 */
export const LIFECYCLE = {
  creating: {
    running: ["boot ok"],
    failed: ["boot failed", "restart found it half-made", "sweeper found nothing behind it"],
  },
  running: {
    paused: ["pause", "sleep (driver can pause)"],
    stopped: ["died", "sleep (driver cannot pause)", "server stop", "restart could not take it over"],
    deleting: ["delete begins"],
    failed: ["sweeper found nothing behind it"],
  },
  paused: {
    running: ["resume", "wake"],
    deleting: ["delete begins"],
    failed: ["resume failed"],
  },
  stopped: {
    running: ["wake"],
    deleting: ["delete begins"],
  },
  deleting: {
    deleted: ["delete ends", "restart or sweeper completes the delete"],
  },
  deleted: {},
  failed: {},
} as const satisfies Record<SandboxState, Partial<Record<SandboxState, readonly string[]>>>;

/** The states a row may be inserted with. */
export const INITIAL_STATES: readonly SandboxState[] = ["creating", "running"];

export function canTransition(from: SandboxState, to: SandboxState): boolean {
  return to in LIFECYCLE[from];
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
