import type { SandboxState } from "@bothy/protocol";
import { DB_NOW_MS } from "./dialect.ts";
import type { SandboxRow } from "./sandbox-rows.ts";
import { all, get, run, type Step } from "./sql-step.ts";
import { sqlStates } from "../sandboxes/lifecycle.ts";

/** What a node tells the others about itself (migration 18's `nodes`). */
export interface NodeInfo {
  id: string;
  /** The URL other nodes reach it at (BOTHY_NODE_URL). */
  url: string;
  drivers: string[];
  /** The templates it holds built. */
  templates: string[];
  vcpu: number;
  memoryMib: number;
  /** How many sandboxes it may run. */
  slots: number;
}

export interface NodeRow {
  id: string;
  url: string;
  /** JSON array. */
  drivers: string;
  /** JSON array. */
  templates: string;
  vcpu: number;
  memory_mib: number;
  slots: number;
  epoch: number;
  /** Times of the database's clock, ms since 1970. */
  started_at: number;
  heartbeat_at: number;
  lease_expires_at: number;
}

/** A node as readers see it: lapsed once its lease ran out by the database's clock. */
export type SeenNode = NodeRow & { lapsed: boolean };

/** A sandbox as readers see it: one of a lapsed node shows `stopped` (its disk is on that node). */
export type SeenSandbox = SandboxRow & { node_lapsed: boolean };

/** Where the lease of `nodes` (aliased `n`) has run out by the database's clock. */
const LAPSED = `n.lease_expires_at <= ${DB_NOW_MS}`;
const HELD = `n.lease_expires_at > ${DB_NOW_MS}`;

/**
 * The nodes of a cluster and their leases (cluster/node-lease.ts). A lease is held with an epoch:
 * each holding of a node's lease, by a restart of it or by whichever process comes after one whose
 * lease lapsed, gets the next epoch; a write for the node's sandboxes checks its epoch in the same
 * transaction (`holds`, under a row lock in PostgreSQL), so a holder that lost its lease cannot write.
 * Every time here is the database's clock (`DB_NOW_MS`), never a host's.
 */
export class NodeQueries {
  /**
   * Takes the node's lease if no one holds it (no row, or its lease ran out): the next epoch. An
   * unlapsed lease is left alone (undefined): its holder may be alive, if paused.
   */
  *acquire(info: NodeInfo, leaseMs: number): Step<{ epoch: number; expiresAt: number } | undefined> {
    const row = yield* get<{ epoch: number; lease_expires_at: number }>(
      `INSERT INTO nodes (id, url, drivers, templates, vcpu, memory_mib, slots, epoch, started_at, heartbeat_at, lease_expires_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, 1, ${DB_NOW_MS}, ${DB_NOW_MS}, ${DB_NOW_MS} + ?)
       ON CONFLICT (id) DO UPDATE SET url = excluded.url, drivers = excluded.drivers, templates = excluded.templates,
         vcpu = excluded.vcpu, memory_mib = excluded.memory_mib, slots = excluded.slots, epoch = nodes.epoch + 1,
         started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at, lease_expires_at = excluded.lease_expires_at
       WHERE nodes.lease_expires_at <= ${DB_NOW_MS}
       RETURNING epoch, lease_expires_at`,
      [
        info.id,
        info.url,
        JSON.stringify(info.drivers),
        JSON.stringify(info.templates),
        info.vcpu,
        info.memoryMib,
        info.slots,
        leaseMs,
      ],
    );
    return row && { epoch: row.epoch, expiresAt: row.lease_expires_at };
  }

  /**
   * Renews the lease of `epoch` while it still holds (undefined once it lapsed or passed on), with
   * what the node holds now; answers the new expiry.
   */
  *heartbeat(
    id: string,
    epoch: number,
    leaseMs: number,
    now: Pick<NodeInfo, "templates" | "slots">,
  ): Step<number | undefined> {
    const row = yield* get<{ lease_expires_at: number }>(
      `UPDATE nodes SET heartbeat_at = ${DB_NOW_MS}, lease_expires_at = ${DB_NOW_MS} + ?, templates = ?, slots = ?
        WHERE id = ? AND epoch = ? AND lease_expires_at > ${DB_NOW_MS}
        RETURNING lease_expires_at`,
      [leaseMs, JSON.stringify(now.templates), now.slots, id, epoch],
    );
    return row?.lease_expires_at;
  }

  /** Ends the lease of `epoch` now (a clean stop), so the node's next start need not wait it out. */
  *release(id: string, epoch: number): Step<boolean> {
    return (
      (yield* run(
        `UPDATE nodes SET lease_expires_at = ${DB_NOW_MS} WHERE id = ? AND epoch = ? AND lease_expires_at > ${DB_NOW_MS}`,
        [id, epoch],
      )) === 1
    );
  }

  /**
   * Whether `epoch` holds the node's lease now. Inside a transaction, PostgreSQL keeps a share lock
   * on the row until it ends, so no successor's `acquire` (an update of the row) lands before the
   * transaction's writes are committed: a write checked here cannot follow a successor's.
   */
  *holds(id: string, epoch: number): Step<boolean> {
    const row = yield* get<{ id: string }>(
      `SELECT id FROM nodes WHERE id = ? AND epoch = ? AND lease_expires_at > ${DB_NOW_MS} FOR SHARE`,
      [id, epoch],
    );
    return row !== undefined;
  }

  /**
   * Names the node's live sandboxes as `epoch`'s: the node's new holding takes over those it had. Only
   * while `epoch` holds the lease, and never back to an older epoch: a holder paused between its
   * `acquire` and this claim cannot take sandboxes back from a successor.
   */
  *claimSandboxes(id: string, epoch: number): Step<number> {
    return yield* run(
      `UPDATE sandboxes SET node_epoch = ?
        WHERE node_id = ? AND state NOT IN (${sqlStates("final")}) AND (node_epoch IS NULL OR node_epoch < ?)
          AND EXISTS (SELECT 1 FROM nodes n WHERE n.id = ? AND n.epoch = ? AND ${HELD})`,
      [epoch, id, epoch, id, epoch],
    );
  }

  /** The node's sandboxes that still own host resources (its start-up recovery and sweeper look at these only). */
  *liveSandboxesOf(id: string): Step<SandboxRow[]> {
    return yield* all<SandboxRow>(`SELECT * FROM sandboxes WHERE node_id = ? AND state IN (${sqlStates("live")})`, [
      id,
    ]);
  }

  /** The node's sandboxes whose time ran out at `at` (SandboxQueries.expiredSandboxes, for one node). */
  *expiredSandboxesOf(id: string, at: string): Step<SandboxRow[]> {
    return yield* all<SandboxRow>(
      `SELECT * FROM sandboxes WHERE node_id = ? AND expires_at <= ? AND state IN (${sqlStates("expirable")})`,
      [id, at],
    );
  }

  *sandboxOwner(sandboxId: string): Step<{ node_id: string | null; node_epoch: number | null } | undefined> {
    return yield* get<{ node_id: string | null; node_epoch: number | null }>(
      `SELECT node_id, node_epoch FROM sandboxes WHERE id = ?`,
      [sandboxId],
    );
  }

  *nodes(): Step<SeenNode[]> {
    const rows = yield* all<NodeRow & { lapsed: number }>(
      `SELECT n.*, CASE WHEN ${LAPSED} THEN 1 ELSE 0 END AS lapsed FROM nodes n ORDER BY n.id`,
    );
    return rows.map((r) => ({ ...r, lapsed: r.lapsed === 1 }));
  }

  /** The database's clock now, ms since 1970. */
  *now(): Step<number> {
    return (yield* get<{ now: number }>(`SELECT ${DB_NOW_MS} AS now`))?.now ?? 0;
  }

  /**
   * A sandbox as readers should see it: one whose node's lease lapsed shows `stopped` while it is
   * not being deleted or gone (its disk is on that node; it runs again when the node takes it back).
   */
  *seenSandbox(sandboxId: string): Step<SeenSandbox | undefined> {
    const row = yield* get<SandboxRow & { seen_state: SandboxState; node_lapsed: number }>(`${SEEN} WHERE s.id = ?`, [
      sandboxId,
    ]);
    return row && seen(row);
  }

  /** Every sandbox not deleted, as readers should see it (see seenSandbox). */
  *seenSandboxes(): Step<SeenSandbox[]> {
    const rows = yield* all<SandboxRow & { seen_state: SandboxState; node_lapsed: number }>(
      `${SEEN} WHERE s.state NOT IN (${sqlStates("final")}) ORDER BY s.created_at`,
    );
    return rows.map(seen);
  }
}

const SEEN = `SELECT s.*,
    CASE WHEN n.id IS NOT NULL AND ${LAPSED} THEN 1 ELSE 0 END AS node_lapsed,
    CASE WHEN n.id IS NOT NULL AND ${LAPSED} AND s.state IN (${sqlStates("active")}) THEN 'stopped' ELSE s.state END AS seen_state
  FROM sandboxes s LEFT JOIN nodes n ON n.id = s.node_id`;

function seen(row: SandboxRow & { seen_state: SandboxState; node_lapsed: number }): SeenSandbox {
  const { seen_state, node_lapsed, ...rest } = row;
  return { ...rest, state: seen_state, node_lapsed: node_lapsed === 1 };
}
