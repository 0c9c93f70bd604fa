import { DB_NOW_MS } from "./dialect.ts";
import { get, run, type Step } from "./sql-step.ts";

export interface ClusterLeaseRow {
  name: string;
  /** Who holds it (a node's id and process), for people reading the table; the epoch is what counts. */
  holder: string;
  epoch: number;
  /** The database's clock, ms since 1970. */
  expires_at: number;
}

/**
 * Named leases of the whole cluster (migration 18's `cluster_leases`), such as the leader's
 * (cluster/leader-lease.ts): a row with an expiry by the database's clock and an epoch that each
 * new holder takes the next of. The same pattern as a node's lease (node-rows.ts).
 */
export class ClusterLeaseQueries {
  /** Takes the lease if no one holds it (no row, or it ran out): the next epoch; else undefined. */
  *acquire(name: string, holder: string, leaseMs: number): Step<{ epoch: number; expiresAt: number } | undefined> {
    const row = yield* get<{ epoch: number; expires_at: number }>(
      `INSERT INTO cluster_leases (name, holder, epoch, expires_at) VALUES (?, ?, 1, ${DB_NOW_MS} + ?)
       ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = cluster_leases.epoch + 1,
         expires_at = excluded.expires_at
       WHERE cluster_leases.expires_at <= ${DB_NOW_MS}
       RETURNING epoch, expires_at`,
      [name, holder, leaseMs],
    );
    return row && { epoch: row.epoch, expiresAt: row.expires_at };
  }

  /** Renews the lease of `epoch` while it still holds; undefined once it lapsed or passed on. */
  *renew(name: string, epoch: number, leaseMs: number): Step<number | undefined> {
    const row = yield* get<{ expires_at: number }>(
      `UPDATE cluster_leases SET expires_at = ${DB_NOW_MS} + ? WHERE name = ? AND epoch = ? AND expires_at > ${DB_NOW_MS}
        RETURNING expires_at`,
      [leaseMs, name, epoch],
    );
    return row?.expires_at;
  }

  /** Whether `epoch` holds the lease now; in a transaction, a share lock keeps a successor out until it ends. */
  *holds(name: string, epoch: number): Step<boolean> {
    const row = yield* get<{ name: string }>(
      `SELECT name FROM cluster_leases WHERE name = ? AND epoch = ? AND expires_at > ${DB_NOW_MS} FOR SHARE`,
      [name, epoch],
    );
    return row !== undefined;
  }

  /** Ends the lease of `epoch` now (a clean stop): another node takes it at its next try. */
  *release(name: string, epoch: number): Step<boolean> {
    return (
      (yield* run(
        `UPDATE cluster_leases SET expires_at = ${DB_NOW_MS} WHERE name = ? AND epoch = ? AND expires_at > ${DB_NOW_MS}`,
        [name, epoch],
      )) === 1
    );
  }

  *lease(name: string): Step<(ClusterLeaseRow & { lapsed: boolean }) | undefined> {
    const row = yield* get<ClusterLeaseRow & { lapsed: number }>(
      `SELECT *, CASE WHEN expires_at <= ${DB_NOW_MS} THEN 1 ELSE 0 END AS lapsed FROM cluster_leases WHERE name = ?`,
      [name],
    );
    return row && { ...row, lapsed: row.lapsed === 1 };
  }
}
