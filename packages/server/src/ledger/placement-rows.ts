import { DB_NOW_MS } from "./dialect.ts";
import { all, get, run, type Step } from "./sql-step.ts";
import { sqlStates } from "../sandboxes/lifecycle.ts";

/** Where a request for a sandbox goes: the node its row names, that node's URL, and whether its lease lapsed. */
export interface SandboxHome {
  node_id: string;
  url: string;
  lapsed: boolean;
}

/** A node as placement weighs it: what it offers, what its booted sandboxes take of it, its lease and drain. */
export interface NodeLoad {
  id: string;
  url: string;
  drivers: string[];
  templates: string[];
  vcpu: number;
  memory_mib: number;
  slots: number;
  draining: boolean;
  /** Its lease ran out by the database's clock: it is down (or cut off), and takes nothing. */
  lapsed: boolean;
  used_slots: number;
  used_vcpu: number;
  used_memory_mib: number;
}

/** Booted or booting: what takes a node's CPU, memory and a slot now (a dormant sandbox has only its disk there). */
const BOOTED = `s.state IN (${sqlStates("active")}) AND s.state NOT IN (${sqlStates("dormant")})`;

/** The rows routing and placement read across a cluster (cluster/request-router.ts, cluster/placement.ts). */
export class PlacementQueries {
  /** The node a sandbox's row names, if any (a single machine's rows name none). */
  *homeOf(sandboxId: string): Step<SandboxHome | undefined> {
    const row = yield* get<{ node_id: string; url: string; lapsed: number }>(
      `SELECT s.node_id, n.url, CASE WHEN n.lease_expires_at <= ${DB_NOW_MS} THEN 1 ELSE 0 END AS lapsed
         FROM sandboxes s JOIN nodes n ON n.id = s.node_id WHERE s.id = ?`,
      [sandboxId],
    );
    return row && { node_id: row.node_id, url: row.url, lapsed: row.lapsed === 1 };
  }

  /** Every node, with its load. */
  *nodeLoads(): Step<NodeLoad[]> {
    const rows = yield* all<{
      id: string;
      url: string;
      drivers: string;
      templates: string;
      vcpu: number;
      memory_mib: number;
      slots: number;
      draining: number;
      lapsed: number;
      used_slots: number | string;
      used_vcpu: number | string;
      used_memory_mib: number | string;
    }>(
      `SELECT n.id, n.url, n.drivers, n.templates, n.vcpu, n.memory_mib, n.slots, n.draining,
              CASE WHEN n.lease_expires_at <= ${DB_NOW_MS} THEN 1 ELSE 0 END AS lapsed,
              COUNT(s.id) AS used_slots, COALESCE(SUM(s.vcpu), 0) AS used_vcpu, COALESCE(SUM(s.memory_mib), 0) AS used_memory_mib
         FROM nodes n LEFT JOIN sandboxes s ON s.node_id = n.id AND ${BOOTED}
        GROUP BY n.id, n.url, n.drivers, n.templates, n.vcpu, n.memory_mib, n.slots, n.draining, n.lease_expires_at
        ORDER BY n.id`,
    );
    // PostgreSQL answers COUNT and SUM of integers as bigint and numeric, which pg gives as strings.
    return rows.map((r) => ({
      ...r,
      drivers: JSON.parse(r.drivers) as string[],
      templates: JSON.parse(r.templates) as string[],
      draining: r.draining === 1,
      lapsed: r.lapsed === 1,
      used_slots: Number(r.used_slots),
      used_vcpu: Number(r.used_vcpu),
      used_memory_mib: Number(r.used_memory_mib),
    }));
  }

  /** Marks a node drained (no create is placed on it) or not; false if there is no such node. */
  *setDraining(nodeId: string, draining: boolean): Step<boolean> {
    return (yield* run(`UPDATE nodes SET draining = ? WHERE id = ?`, [draining ? 1 : 0, nodeId])) === 1;
  }
}
