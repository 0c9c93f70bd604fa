import type Database from "better-sqlite3";
import { LIVE_STATES } from "@bothy/protocol";

/** A volume as the ledger keeps it (migration 14). */
export interface VolumeRow {
  id: string;
  tenant: string;
  name: string;
  size_mib: number;
  created_at: string;
}

/** One sandbox's mount of one volume. */
export interface VolumeClaim {
  sandbox_id: string;
  volume_id: string;
  path: string;
  read_only: number;
}

const LIVE = LIVE_STATES.map((s) => `'${s}'`).join(", ");

/**
 * Volumes and the sandboxes' claims on them. A claim counts while its sandbox's row is live
 * (asleep included), so a deleted or failed sandbox releases its volumes with no write of its own.
 */
export class VolumeRows {
  constructor(private readonly db: Database.Database) {}

  insert(row: VolumeRow): void {
    this.db
      .prepare(
        `INSERT INTO volumes (id, tenant, name, size_mib, created_at) VALUES (@id, @tenant, @name, @size_mib, @created_at)`,
      )
      .run(row);
  }

  byName(tenant: string, name: string): VolumeRow | undefined {
    return this.db.prepare(`SELECT * FROM volumes WHERE tenant = ? AND name = ?`).get(tenant, name) as
      VolumeRow | undefined;
  }

  byId(id: string): VolumeRow | undefined {
    return this.db.prepare(`SELECT * FROM volumes WHERE id = ?`).get(id) as VolumeRow | undefined;
  }

  list(tenant: string | undefined): VolumeRow[] {
    return (
      tenant === undefined
        ? this.db.prepare(`SELECT * FROM volumes ORDER BY created_at, id`).all()
        : this.db.prepare(`SELECT * FROM volumes WHERE tenant = ? ORDER BY created_at, id`).all(tenant)
    ) as VolumeRow[];
  }

  allIds(): Set<string> {
    return new Set((this.db.prepare(`SELECT id FROM volumes`).all() as Array<{ id: string }>).map((r) => r.id));
  }

  /** The tenant's total volume size in MiB. */
  totalMib(tenant: string): number {
    const row = this.db
      .prepare(`SELECT COALESCE(SUM(size_mib), 0) AS mib FROM volumes WHERE tenant = ?`)
      .get(tenant) as {
      mib: number;
    };
    return row.mib;
  }

  /** Claims on a volume by sandboxes whose rows are live. */
  liveClaims(volumeId: string): VolumeClaim[] {
    return this.db
      .prepare(
        `SELECT sv.* FROM sandbox_volumes sv JOIN sandboxes s ON s.id = sv.sandbox_id
         WHERE sv.volume_id = ? AND s.state IN (${LIVE}) ORDER BY sv.sandbox_id`,
      )
      .all(volumeId) as VolumeClaim[];
  }

  /** A sandbox's claims, whatever its state. */
  claimsOf(sandboxId: string): VolumeClaim[] {
    return this.db
      .prepare(`SELECT * FROM sandbox_volumes WHERE sandbox_id = ? ORDER BY path`)
      .all(sandboxId) as VolumeClaim[];
  }

  addClaims(claims: readonly VolumeClaim[]): void {
    const insert = this.db.prepare(
      `INSERT INTO sandbox_volumes (sandbox_id, volume_id, path, read_only) VALUES (@sandbox_id, @volume_id, @path, @read_only)`,
    );
    this.db.transaction(() => {
      for (const c of claims) insert.run(c);
    })();
  }

  /**
   * Removes the volume's row and the claims of sandboxes that are gone, if no live sandbox claims
   * it; returns the live claims that stopped it (none: it was removed).
   */
  remove(volumeId: string): VolumeClaim[] {
    return this.db.transaction(() => {
      const live = this.liveClaims(volumeId);
      if (live.length > 0) return live;
      this.db.prepare(`DELETE FROM sandbox_volumes WHERE volume_id = ?`).run(volumeId);
      this.db.prepare(`DELETE FROM volumes WHERE id = ?`).run(volumeId);
      return [];
    })();
  }
}
