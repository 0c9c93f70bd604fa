import type { OnTimeout } from "@bothy/protocol";
import { all, get, run, type Step, type Asynced } from "./sql-step.ts";

/** Why a dormant sandbox sleeps, where that decides who may wake it and when it is deleted. */
export type SleepCause = "timeout" | "pause";

/**
 * A sandbox's lifecycle beyond the defaults (migration 17): kept only for sandboxes whose create
 * asked for `on_timeout: "sleep"` or `auto_wake: false`; a sandbox without a row is deleted at its
 * timeout and woken by any call.
 */
export interface LifecycleRow {
  sandbox_id: string;
  on_timeout: OnTimeout;
  /** 1: a call wakes it whatever put it to sleep; 0: after its timeout or a pause, only a resume does. */
  auto_wake: number;
  /** The timeout it was last given, in seconds: a wake after its timeout gives it this much again. */
  timeout_s: number;
  /** Set while it sleeps because its timeout passed (its `expires_at` is then its final deadline) or it was paused. */
  asleep_by: SleepCause | null;
}

/** Ids bound in one `IN (…)`: well inside both stores' limits on parameters. */
const ID_BATCH = 500;

export class LifecycleQueries {
  *put(row: LifecycleRow): Step<void> {
    yield* run(
      `INSERT INTO sandbox_lifecycle (sandbox_id, on_timeout, auto_wake, timeout_s, asleep_by) VALUES (?, ?, ?, ?, ?)
         ON CONFLICT(sandbox_id) DO UPDATE SET on_timeout = excluded.on_timeout, auto_wake = excluded.auto_wake,
           timeout_s = excluded.timeout_s, asleep_by = excluded.asleep_by`,
      [row.sandbox_id, row.on_timeout, row.auto_wake, row.timeout_s, row.asleep_by],
    );
  }

  *of(sandboxId: string): Step<LifecycleRow | undefined> {
    return yield* get<LifecycleRow>(`SELECT * FROM sandbox_lifecycle WHERE sandbox_id = ?`, [sandboxId]);
  }

  /** The rows of these sandboxes, by id (a list's, in a few queries rather than one per sandbox). */
  *ofMany(sandboxIds: readonly string[]): Step<Map<string, LifecycleRow>> {
    const found = new Map<string, LifecycleRow>();
    for (let i = 0; i < sandboxIds.length; i += ID_BATCH) {
      const ids = sandboxIds.slice(i, i + ID_BATCH);
      const rows = yield* all<LifecycleRow>(
        `SELECT * FROM sandbox_lifecycle WHERE sandbox_id IN (${ids.map(() => "?").join(", ")})`,
        ids,
      );
      for (const row of rows) found.set(row.sandbox_id, row);
    }
    return found;
  }

  /** The timeout a `POST /sandboxes/{id}/timeout` gave it (no-op for a sandbox without a row). */
  *setTimeoutS(sandboxId: string, timeoutS: number): Step<void> {
    yield* run(`UPDATE sandbox_lifecycle SET timeout_s = ? WHERE sandbox_id = ?`, [timeoutS, sandboxId]);
  }

  /** Why it sleeps now, or null once awake (no-op for a sandbox without a row). */
  *setAsleepBy(sandboxId: string, cause: SleepCause | null): Step<void> {
    yield* run(`UPDATE sandbox_lifecycle SET asleep_by = ? WHERE sandbox_id = ?`, [cause, sandboxId]);
  }
}

/** The lifecycle rows as the server's synchronous callers see them. */
export type LifecycleRows = Asynced<LifecycleQueries>;
