import { all, get, notify, run, type Step, type Asynced } from "./sql-step.ts";
import type { ApprovalInfo, ApprovalState } from "@bothy/protocol";

/**
 * The channel a decision notifies (the approval's id as payload, "" for several): the node holding
 * its caller reads the row and answers it.
 */
export const APPROVALS_CHANNEL = "bothy_approvals";

/** One row of the `approvals` table (migration 11; `node_id` 20). */
export interface ApprovalRow {
  id: string;
  tenant: string;
  sandbox_id: string;
  conversation_id: string | null;
  kind: "http" | "tool";
  method: string | null;
  host: string | null;
  path: string | null;
  tool: string | null;
  excerpt: string;
  rule: string;
  state: ApprovalState;
  created_at: string;
  expires_at: string;
  decided_at: string | null;
  decided_by: string | null;
  grant_kind: "once" | "host" | null;
  grant_until: string | null;
  reason: string | null;
  /** The node whose process holds its caller; null on a single machine. */
  node_id: string | null;
}

/** How a pending approval ends: its new state and what the decision says. */
export interface Settlement {
  state: Exclude<ApprovalState, "pending">;
  decidedBy: string | null;
  grantKind: "once" | "host" | null;
  grantUntil: string | null;
  reason: string | null;
}

export function toApprovalInfo(row: ApprovalRow): ApprovalInfo {
  return {
    approval_id: row.id,
    tenant: row.tenant,
    sandbox_id: row.sandbox_id,
    conversation_id: row.conversation_id,
    kind: row.kind,
    method: row.method,
    host: row.host,
    path: row.path,
    tool: row.tool,
    excerpt: row.excerpt,
    rule: row.rule,
    state: row.state,
    created_at: row.created_at,
    expires_at: row.expires_at,
    decided_at: row.decided_at,
    decided_by: row.decided_by,
    grant: row.grant_kind === null ? null : { kind: row.grant_kind, until: row.grant_until },
    reason: row.reason,
  };
}

/**
 * The ledger's approvals. Every write is durable before it returns (the ledger's
 * synchronous=FULL), and a pending row leaves `pending` only by a compare-and-set, so a decision
 * lands once: a second one finds the row decided and changes nothing.
 */
export class ApprovalQueries {
  *insert(
    row: Omit<
      ApprovalRow,
      "state" | "decided_at" | "decided_by" | "grant_kind" | "grant_until" | "reason" | "node_id"
    > & {
      node_id?: string | null;
    },
  ): Step<void> {
    yield* run(
      `INSERT INTO approvals (id, tenant, sandbox_id, conversation_id, kind, method, host, path, tool, excerpt, rule, state, created_at, expires_at, node_id)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)`,
      [
        row.id,
        row.tenant,
        row.sandbox_id,
        row.conversation_id,
        row.kind,
        row.method,
        row.host,
        row.path,
        row.tool,
        row.excerpt,
        row.rule,
        row.created_at,
        row.expires_at,
        row.node_id ?? null,
      ],
    );
  }

  *get(id: string): Step<ApprovalRow | undefined> {
    return yield* get<ApprovalRow>(`SELECT * FROM approvals WHERE id = ?`, [id]);
  }

  /** Newest first; `tenant` undefined: every tenant's. */
  *list(filter: { tenant?: string; state?: ApprovalState; sandboxId?: string; limit: number }): Step<ApprovalRow[]> {
    const filters: Array<[string, string | undefined]> = [
      ["tenant", filter.tenant],
      ["state", filter.state],
      ["sandbox_id", filter.sandboxId],
    ];
    const conditions = filters.filter((c): c is [string, string] => c[1] !== undefined);
    const where = conditions.map(([column]) => `${column} = ?`);
    const args = conditions.map(([, value]) => value);
    const sql = `SELECT * FROM approvals ${where.length ? `WHERE ${where.join(" AND ")}` : ""} ORDER BY created_at DESC, rowid DESC LIMIT ?`;
    return yield* all<ApprovalRow>(sql, [...args, filter.limit]);
  }

  /**
   * Ends a pending approval; undefined (and nothing changed) when it is not pending. One
   * compare-and-set, so of two nodes deciding at once one changes the row and the other finds it
   * decided. Notifies APPROVALS_CHANNEL, so the node holding its caller hears of it.
   */
  *settle(id: string, how: Settlement, at: string = new Date().toISOString()): Step<ApprovalRow | undefined> {
    const row = yield* get<ApprovalRow>(
      `UPDATE approvals SET state = ?, decided_at = ?, decided_by = ?, grant_kind = ?, grant_until = ?, reason = ?
         WHERE id = ? AND state = 'pending' RETURNING *`,
      [how.state, at, how.decidedBy, how.grantKind, how.grantUntil, how.reason, id],
    );
    if (row) yield* notify(APPROVALS_CHANNEL, id);
    return row;
  }

  /**
   * Cancels every pending approval whose caller a process of node `nodeId` held (null: a single
   * machine's rows) at once: start-up, when nothing that node held before survives. Other nodes'
   * callers still wait for theirs.
   */
  *cancelAllPending(
    reason: string,
    at: string = new Date().toISOString(),
    nodeId: string | null = null,
  ): Step<ApprovalRow[]> {
    const rows = yield* all<ApprovalRow>(
      `UPDATE approvals SET state = 'cancelled', decided_at = ?, reason = ?
         WHERE state = 'pending' AND COALESCE(node_id, '') = ? RETURNING *`,
      [at, reason, nodeId ?? ""],
    );
    if (rows.length > 0) yield* notify(APPROVALS_CHANNEL);
    return rows;
  }

  /** Whether an approval granted `host` to this sandbox until after `at`. */
  *hostGranted(sandboxId: string, host: string, at: string): Step<boolean> {
    return (
      (yield* get(
        `SELECT 1 FROM approvals WHERE sandbox_id = ? AND host = ? AND state = 'approved' AND grant_kind = 'host' AND grant_until > ? LIMIT 1`,
        [sandboxId, host, at],
      )) !== undefined
    );
  }
}

/** Approvals as the server's synchronous callers see them. */
export type ApprovalRows = Asynced<ApprovalQueries>;
