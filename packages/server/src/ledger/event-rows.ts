import type Database from "better-sqlite3";
import type { EventRow } from "./ledger.ts";
import { StatementCache } from "./statement-cache.ts";

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
export class EventRows {
  private readonly statements: StatementCache;

  constructor(private readonly db: Database.Database) {
    this.statements = new StatementCache(db);
  }

  private cached(sql: string): Database.Statement {
    return this.statements.get(sql);
  }

  /** The scope's rows after `after`, oldest first, at most `limit`. */
  page(after: number, scope: EventScope, limit: number): EventRow[] {
    const { tenant, sandboxId } = scope;
    if (sandboxId !== undefined)
      return (
        tenant === null
          ? this.cached(`SELECT * FROM events WHERE sandbox_id = ? AND seq > ? ORDER BY seq LIMIT ?`).all(
              sandboxId,
              after,
              limit,
            )
          : this.cached(
              `SELECT * FROM events INDEXED BY events_sandbox WHERE sandbox_id = ? AND seq > ? AND tenant = ? ORDER BY seq LIMIT ?`,
            ).all(sandboxId, after, tenant, limit)
      ) as EventRow[];
    return (
      tenant === null
        ? this.cached(`SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?`).all(after, limit)
        : this.cached(
            `SELECT * FROM events INDEXED BY events_tenant WHERE tenant = ? AND seq > ? ORDER BY seq LIMIT ?`,
          ).all(tenant, after, limit)
    ) as EventRow[];
  }

  /** The newest row's sequence number (0 for none). */
  lastSeq(): number {
    return (this.cached(`SELECT COALESCE(MAX(seq), 0) AS seq FROM events`).get() as { seq: number }).seq;
  }

  /**
   * The first sequence number the retention keeps at `now` (rows below it may go; 0: none). Sequence
   * numbers grow with time and are never reused, so both limits are a bound on `seq`: the newest
   * `maxRows` are those from `MAX(seq) - maxRows + 1`, and the oldest young row is found by walking
   * from the oldest end, only as far as there are rows to delete.
   */
  keptFrom(retention: EventRetention, now: number): number {
    let from = 0;
    if (retention.maxRows !== undefined) from = Math.max(from, this.lastSeq() - retention.maxRows + 1);
    if (retention.maxAgeMs !== undefined) {
      const cutoff = new Date(now - retention.maxAgeMs).toISOString();
      const young = this.cached(`SELECT seq FROM events WHERE created_at >= ? ORDER BY seq LIMIT 1`).get(cutoff) as
        { seq: number } | undefined;
      from = Math.max(from, young?.seq ?? this.lastSeq() + 1);
    }
    return from;
  }

  /**
   * Deletes up to `batch` of the oldest rows below `seq`; answers how many. The caller repeats
   * while a whole batch went, yielding between, so a large backlog never holds the event loop long.
   */
  deleteBelow(seq: number, batch: number): number {
    return this.cached(
      `DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE seq < ? ORDER BY seq LIMIT ?)`,
    ).run(seq, batch).changes;
  }
}
