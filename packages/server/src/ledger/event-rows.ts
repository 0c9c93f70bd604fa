import { all, get, notify, relaxed, run, serialize, transaction, type Step, type Asynced } from "./sql-step.ts";

/** The channel an event's insert notifies: other nodes' readers wake and read the rows after their last. */
export const EVENTS_CHANNEL = "bothy_events";

/** The lock event inserts take in turn (a 64-bit key of bothy's own: "bothy" and 1). */
const EVENT_ORDER_LOCK = 0x626f74687901;

export interface EventRow {
  seq: number;
  type: string;
  sandbox_id: string | null;
  /** Null: a host-wide event, seen by admin keys only. */
  tenant: string | null;
  data: string;
  created_at: string;
}

/** Which rows one reader may see: a tenant's own (with `tenant`), or every row (an admin's, `null`). */
export interface EventScope {
  tenant: string | null;
  /** Only this sandbox's rows. */
  sandboxId?: string;
}

/** How long events are kept: rows older than `maxAgeMs`, or beyond the newest `maxRows`, go. */
export interface EventRetention {
  maxAgeMs: number | undefined;
  maxRows: number | undefined;
}

/**
 * The events table as its readers page it and the sweeper prunes it. A page is one indexed range
 * of the reader's own rows (`events_tenant` or `events_sandbox`), so a tenant's replay reads no
 * row of another tenant and each query reads at most a page.
 */
export class EventQueries {
  /**
   * Appends an event and returns its sequence number (the SSE event id). Its tenant is its
   * sandbox's, or `tenant` for one about a tenant as a whole; else it is host-wide. Written relaxed,
   * like a command's record.
   *
   * Readers page by `seq > last seen`, so a row must never become visible after one with a higher
   * number: on PostgreSQL two transactions take their numbers in one order and may commit in the
   * other, and a reader between the two commits would pass the first for good. So each insert
   * takes the same transaction lock first and holds it until it commits: numbers are taken and
   * committed in one order, across every node. The insert also notifies EVENTS_CHANNEL, which
   * wakes the other nodes' readers (events/event-bus.ts) when it commits.
   */
  *insertEvent(type: string, sandboxId: string | null, data: object, tenant?: string): Step<EventRow> {
    const created_at = new Date().toISOString();
    const json = JSON.stringify(data);
    const row = yield* relaxed(() =>
      transaction(function* () {
        yield* serialize(EVENT_ORDER_LOCK);
        // The sandbox's tenant is looked up in the insert itself (no row read and copied for one field).
        const inserted = yield* get<{ seq: number; tenant: string | null }>(
          `INSERT INTO events (type, sandbox_id, data, created_at, tenant)
             VALUES (?, ?, ?, ?, COALESCE(?, (SELECT tenant FROM sandboxes WHERE id = ?))) RETURNING seq, tenant`,
          [type, sandboxId, json, created_at, tenant ?? null, sandboxId],
        );
        yield* notify(EVENTS_CHANNEL);
        return inserted;
      }),
    );
    if (!row) throw new Error("the events insert returned no row");
    return { seq: row.seq, type, sandbox_id: sandboxId, tenant: row.tenant, data: json, created_at };
  }

  *eventsSince(seq: number, sandboxId?: string, limit = 1000): Step<EventRow[]> {
    return sandboxId === undefined
      ? yield* all<EventRow>(`SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?`, [seq, limit])
      : yield* all<EventRow>(`SELECT * FROM events WHERE seq > ? AND sandbox_id = ? ORDER BY seq LIMIT ?`, [
          seq,
          sandboxId,
          limit,
        ]);
  }

  /** A sandbox's events of these types after `seq`, oldest first (its audit: GET /sandboxes/{id}/audit). */
  *sandboxEvents(sandboxId: string, types: readonly string[], seq: number, limit: number): Step<EventRow[]> {
    return yield* all<EventRow>(
      `SELECT * FROM events WHERE sandbox_id = ? AND seq > ? AND type IN (${types.map(() => "?").join(",")}) ORDER BY seq LIMIT ?`,
      [sandboxId, seq, ...types, limit],
    );
  }

  /** The scope's rows after `after`, oldest first, at most `limit`. */
  *page(after: number, scope: EventScope, limit: number): Step<EventRow[]> {
    const { tenant, sandboxId } = scope;
    if (sandboxId !== undefined)
      return tenant === null
        ? yield* all<EventRow>(`SELECT * FROM events WHERE sandbox_id = ? AND seq > ? ORDER BY seq LIMIT ?`, [
            sandboxId,
            after,
            limit,
          ])
        : yield* all<EventRow>(
            `SELECT * FROM events INDEXED BY events_sandbox WHERE sandbox_id = ? AND seq > ? AND tenant = ? ORDER BY seq LIMIT ?`,
            [sandboxId, after, tenant, limit],
          );
    return tenant === null
      ? yield* all<EventRow>(`SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?`, [after, limit])
      : yield* all<EventRow>(
          `SELECT * FROM events INDEXED BY events_tenant WHERE tenant = ? AND seq > ? ORDER BY seq LIMIT ?`,
          [tenant, after, limit],
        );
  }

  /** The newest row's sequence number (0 for none). */
  *lastSeq(): Step<number> {
    return (yield* get<{ seq: number }>(`SELECT COALESCE(MAX(seq), 0) AS seq FROM events`))?.seq ?? 0;
  }

  /**
   * The first sequence number the retention keeps at `now` (rows below it may go; 0: none). Sequence
   * numbers grow with time and are never reused, so both limits are a bound on `seq`: the newest
   * `maxRows` are those from `MAX(seq) - maxRows + 1`, and the oldest young row is found by walking
   * from the oldest end, only as far as there are rows to delete.
   */
  *keptFrom(retention: EventRetention, now: number): Step<number> {
    let from = 0;
    if (retention.maxRows !== undefined) from = Math.max(from, (yield* this.lastSeq()) - retention.maxRows + 1);
    if (retention.maxAgeMs !== undefined) {
      const cutoff = new Date(now - retention.maxAgeMs).toISOString();
      const young = yield* get<{ seq: number }>(`SELECT seq FROM events WHERE created_at >= ? ORDER BY seq LIMIT 1`, [
        cutoff,
      ]);
      from = Math.max(from, young?.seq ?? (yield* this.lastSeq()) + 1);
    }
    return from;
  }

  /**
   * Deletes up to `batch` of the oldest rows below `seq`; answers how many. The caller repeats
   * while a whole batch went, yielding between, so a large backlog never holds the event loop long.
   */
  *deleteBelow(seq: number, batch: number): Step<number> {
    return yield* run(`DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE seq < ? ORDER BY seq LIMIT ?)`, [
      seq,
      batch,
    ]);
  }
}

/** The events table as the server's synchronous callers see it. */
export type EventRows = Asynced<EventQueries>;
