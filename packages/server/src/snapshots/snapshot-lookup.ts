/**
 * A tenant's snapshot by id or name, as every route and the create path look it up: another
 * tenant's snapshot is answered exactly as one that never existed.
 */
import { BothyError, SNAPSHOT_ID_RE, SNAPSHOT_NAME_RE } from "@bothy/protocol";
import type { SnapshotRow, SnapshotRows } from "../ledger/snapshot-rows.ts";

export async function tenantSnapshot(rows: SnapshotRows, tenant: string, ref: string): Promise<SnapshotRow> {
  const row = SNAPSHOT_ID_RE.test(ref)
    ? await rows.byId(ref)
    : SNAPSHOT_NAME_RE.test(ref)
      ? await rows.byName(tenant, ref)
      : undefined;
  if (!row || row.tenant !== tenant)
    throw new BothyError("snapshot_not_found", `No snapshot ${ref.slice(0, 80)}; GET /snapshots lists this tenant's.`);
  return row;
}
