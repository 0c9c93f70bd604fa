import { setImmediate as nextTurn } from "node:timers/promises";
import type { EventQueries, EventRetention, EventRows } from "../ledger/event-rows.ts";
import type { Asynced } from "../ledger/sql-step.ts";
import type { Logger } from "./server-events.ts";

/** Rows one delete removes; the pass yields between batches. */
const BATCH_ROWS = 5000;

const UNITS_MS: Record<string, number> = { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/**
 * BOTHY_EVENTS_RETENTION: comma-separated limits, each an age (`30d`, `12h`, `90m`, `600s`) or a
 * number of rows (`1000000`); a row goes when it is past either. Answers what is wrong otherwise.
 */
export function parseRetention(text: string): EventRetention | string {
  const retention: EventRetention = { maxAgeMs: undefined, maxRows: undefined };
  const parts = text
    .split(",")
    .map((p) => p.trim())
    .filter(Boolean);
  if (parts.length === 0) return "give an age such as 7d, a number of rows such as 1000000, or both: 7d,1000000";
  for (const part of parts) {
    const age = /^([1-9][0-9]{0,8})([smhd])$/.exec(part);
    if (age) {
      if (retention.maxAgeMs !== undefined) return "one age only";
      retention.maxAgeMs = Number(age[1]) * (UNITS_MS[age[2] ?? "s"] ?? 1000);
    } else if (/^[1-9][0-9]{0,11}$/.test(part)) {
      if (retention.maxRows !== undefined) return "one number of rows only";
      retention.maxRows = Number(part);
    } else return `"${part.slice(0, 32)}" is neither an age (7d, 12h, 90m, 600s) nor a number of rows (1000000)`;
  }
  return retention;
}

/**
 * One pruning pass (a sweeper step): deletes every event past the retention, oldest first, a
 * batch at a time so a large backlog never holds the event loop for long. Rows written during
 * the pass are judged by the next one.
 */
export async function pruneEvents(
  rows: Pick<EventRows | Asynced<EventQueries>, "keptFrom" | "deleteBelow">,
  retention: EventRetention,
  log: Logger,
  now = Date.now(),
  batch = BATCH_ROWS,
): Promise<number> {
  const keptFrom = await rows.keptFrom(retention, now);
  let deleted = 0;
  for (;;) {
    const n = await rows.deleteBelow(keptFrom, batch);
    deleted += n;
    if (n < batch) break;
    await nextTurn();
  }
  if (deleted > 0) log("events_pruned", { rows: deleted, kept_from: keptFrom });
  return deleted;
}
