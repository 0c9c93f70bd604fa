import { all, get, run, transaction, type Step, type Asynced } from "./sql-step.ts";
import { LIVE_STATES } from "@bothy/protocol";

/** A snapshot as the ledger keeps it (migration 16). */
export interface SnapshotRow {
  id: string;
  tenant: string;
  name: string | null;
  source_sandbox_id: string;
  template: string;
  template_hash: string;
  driver: string;
  /** Its layer in the server's snapshot layer store. */
  layer_id: string;
  /** The template layer at the bottom of its chain (in the template store, whose sweep must keep it). */
  template_layer: string;
  bytes: number;
  created_at: string;
  /** The Idempotency-Key of the fork that made it, if any. */
  idempotency_key: string | null;
  /** 1: it kept memory and processes; 0: files only; null: taken before migration 21 recorded it. */
  memory: number | null;
}

const LIVE = LIVE_STATES.map((s) => `'${s}'`).join(", ");

/** `bytes` is a BIGINT, which a PostgreSQL driver may hand back as a string. */
function normal(row: SnapshotRow | undefined): SnapshotRow | undefined {
  return row && { ...row, bytes: Number(row.bytes), memory: row.memory === null ? null : Number(row.memory) };
}

/**
 * Snapshots and the sandboxes started from them. A use counts while its sandbox's row is live
 * (asleep included), so a deleted or failed sandbox lets go of its snapshot with no write of its own.
 */
export class SnapshotQueries {
  *insert(row: SnapshotRow): Step<void> {
    yield* run(
      `INSERT INTO snapshots (id, tenant, name, source_sandbox_id, template, template_hash, driver, layer_id,
         template_layer, bytes, created_at, idempotency_key, memory) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      [
        row.id,
        row.tenant,
        row.name,
        row.source_sandbox_id,
        row.template,
        row.template_hash,
        row.driver,
        row.layer_id,
        row.template_layer,
        row.bytes,
        row.created_at,
        row.idempotency_key,
        row.memory,
      ],
    );
  }

  *byId(id: string): Step<SnapshotRow | undefined> {
    return normal(yield* get<SnapshotRow>(`SELECT * FROM snapshots WHERE id = ?`, [id]));
  }

  *byName(tenant: string, name: string): Step<SnapshotRow | undefined> {
    return normal(yield* get<SnapshotRow>(`SELECT * FROM snapshots WHERE tenant = ? AND name = ?`, [tenant, name]));
  }

  *byIdempotencyKey(tenant: string, key: string): Step<SnapshotRow | undefined> {
    return normal(
      yield* get<SnapshotRow>(`SELECT * FROM snapshots WHERE tenant = ? AND idempotency_key = ?`, [tenant, key]),
    );
  }

  *list(tenant: string): Step<SnapshotRow[]> {
    const rows = yield* all<SnapshotRow>(`SELECT * FROM snapshots WHERE tenant = ? ORDER BY created_at, id`, [tenant]);
    return rows.map((r) => normal(r) ?? r);
  }

  /** Every snapshot's layer and the template layer under it: what the layer sweeps keep. */
  *layers(): Step<Array<{ layer_id: string; template_layer: string }>> {
    return yield* all<{ layer_id: string; template_layer: string }>(`SELECT layer_id, template_layer FROM snapshots`);
  }

  /** The tenant's snapshots' total bytes. */
  *totalBytes(tenant: string): Step<number> {
    const row = yield* get<{ b: number | string }>(
      `SELECT COALESCE(SUM(bytes), 0) AS b FROM snapshots WHERE tenant = ?`,
      [tenant],
    );
    return Number(row?.b ?? 0);
  }

  /** The snapshot sandbox `sandboxId` started from, whatever its state. */
  *ofSandbox(sandboxId: string): Step<SnapshotRow | undefined> {
    return normal(
      yield* get<SnapshotRow>(
        `SELECT s.* FROM sandbox_snapshots ss JOIN snapshots s ON s.id = ss.snapshot_id WHERE ss.sandbox_id = ?`,
        [sandboxId],
      ),
    );
  }

  *addUse(sandboxId: string, snapshotId: string): Step<void> {
    yield* run(`INSERT INTO sandbox_snapshots (sandbox_id, snapshot_id) VALUES (?, ?)`, [sandboxId, snapshotId]);
  }

  /** Live sandboxes started from the snapshot. */
  *liveUsers(snapshotId: string): Step<string[]> {
    const rows = yield* all<{ sandbox_id: string }>(
      `SELECT ss.sandbox_id FROM sandbox_snapshots ss JOIN sandboxes s ON s.id = ss.sandbox_id
         WHERE ss.snapshot_id = ? AND s.state IN (${LIVE}) ORDER BY ss.sandbox_id`,
      [snapshotId],
    );
    return rows.map((r) => r.sandbox_id);
  }

  /**
   * Removes the snapshot's row and the uses of sandboxes that are gone, if no live sandbox uses
   * it; returns the live users that stopped it (none: it was removed).
   */
  *remove(snapshotId: string): Step<string[]> {
    return yield* transaction(() => this.removeUnused(snapshotId));
  }

  private *removeUnused(snapshotId: string): Step<string[]> {
    const live = yield* this.liveUsers(snapshotId);
    if (live.length > 0) return live;
    yield* run(`DELETE FROM sandbox_snapshots WHERE snapshot_id = ?`, [snapshotId]);
    yield* run(`DELETE FROM snapshots WHERE id = ?`, [snapshotId]);
    return [];
  }
}

/** Snapshots as the server's synchronous callers see them. */
export type SnapshotRows = Asynced<SnapshotQueries>;
