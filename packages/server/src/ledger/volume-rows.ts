import { all, get, run, transaction, type Step, type Asynced } from "./sql-step.ts";
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
export class VolumeQueries {
  *insert(row: VolumeRow): Step<void> {
    yield* run(`INSERT INTO volumes (id, tenant, name, size_mib, created_at) VALUES (?, ?, ?, ?, ?)`, [
      row.id,
      row.tenant,
      row.name,
      row.size_mib,
      row.created_at,
    ]);
  }

  *byName(tenant: string, name: string): Step<VolumeRow | undefined> {
    return yield* get<VolumeRow>(`SELECT * FROM volumes WHERE tenant = ? AND name = ?`, [tenant, name]);
  }

  *byId(id: string): Step<VolumeRow | undefined> {
    return yield* get<VolumeRow>(`SELECT * FROM volumes WHERE id = ?`, [id]);
  }

  *list(tenant: string | undefined): Step<VolumeRow[]> {
    return tenant === undefined
      ? yield* all<VolumeRow>(`SELECT * FROM volumes ORDER BY created_at, id`)
      : yield* all<VolumeRow>(`SELECT * FROM volumes WHERE tenant = ? ORDER BY created_at, id`, [tenant]);
  }

  *allIds(): Step<Set<string>> {
    return new Set((yield* all<{ id: string }>(`SELECT id FROM volumes`)).map((r) => r.id));
  }

  /** The tenant's total volume size in MiB. */
  *totalMib(tenant: string): Step<number> {
    return (
      (yield* get<{ mib: number }>(`SELECT COALESCE(SUM(size_mib), 0) AS mib FROM volumes WHERE tenant = ?`, [tenant]))
        ?.mib ?? 0
    );
  }

  /** Claims on a volume by sandboxes whose rows are live. */
  *liveClaims(volumeId: string): Step<VolumeClaim[]> {
    return yield* all<VolumeClaim>(
      `SELECT sv.* FROM sandbox_volumes sv JOIN sandboxes s ON s.id = sv.sandbox_id
         WHERE sv.volume_id = ? AND s.state IN (${LIVE}) ORDER BY sv.sandbox_id`,
      [volumeId],
    );
  }

  /** A sandbox's claims, whatever its state. */
  *claimsOf(sandboxId: string): Step<VolumeClaim[]> {
    return yield* all<VolumeClaim>(`SELECT * FROM sandbox_volumes WHERE sandbox_id = ? ORDER BY path`, [sandboxId]);
  }

  *addClaims(claims: readonly VolumeClaim[]): Step<void> {
    yield* transaction(function* () {
      for (const c of claims)
        yield* run(`INSERT INTO sandbox_volumes (sandbox_id, volume_id, path, read_only) VALUES (?, ?, ?, ?)`, [
          c.sandbox_id,
          c.volume_id,
          c.path,
          c.read_only,
        ]);
    });
  }

  /**
   * Removes the volume's row and the claims of sandboxes that are gone, if no live sandbox claims
   * it; returns the live claims that stopped it (none: it was removed).
   */
  *remove(volumeId: string): Step<VolumeClaim[]> {
    return yield* transaction(() => this.removeUnclaimed(volumeId));
  }

  private *removeUnclaimed(volumeId: string): Step<VolumeClaim[]> {
    const live = yield* this.liveClaims(volumeId);
    if (live.length > 0) return live;
    yield* run(`DELETE FROM sandbox_volumes WHERE volume_id = ?`, [volumeId]);
    yield* run(`DELETE FROM volumes WHERE id = ?`, [volumeId]);
    return [];
  }
}

/** Volumes as the server's synchronous callers see them. */
export type VolumeRows = Asynced<VolumeQueries>;
