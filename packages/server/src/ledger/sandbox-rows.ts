import { BothyError, type SandboxState } from "@bothy/protocol";
import { all, get, run, transaction, type Step } from "./sql-step.ts";
import { canTransition, INITIAL_STATES, sqlStates, TransitionError } from "../sandboxes/lifecycle.ts";

/** The tenant every row made before tenants existed belongs to, and the bootstrap key's. */
export const DEFAULT_TENANT = "default";

export interface SandboxRow {
  id: string;
  template: string;
  template_hash: string;
  driver: string;
  acceleration: string | null;
  vcpu: number;
  memory_mib: number;
  disk_mib: number | null;
  max_processes: number | null;
  state: SandboxState;
  created_at: string;
  updated_at: string;
  deleted_at: string | null;
  error: string | null;
  expires_at: string | null;
  delete_on_disconnect: number;
  disconnect_grace_s: number | null;
  network: string | null;
  /** JSON of what the create asked of the gateway (gateway/policies.ts SandboxPolicyRecord); null: nothing. */
  policy: string | null;
  /** JSON object of the caller's labels. */
  metadata: string | null;
  tenant: string;
  /** The node that runs it and the epoch of that node's lease it was made or taken over in (cluster/); null on a single machine. */
  node_id: string | null;
  node_epoch: number | null;
}

/** What a new sandbox's row holds where its create says nothing. */
const SANDBOX_DEFAULTS = {
  expires_at: null,
  delete_on_disconnect: 0,
  disconnect_grace_s: null,
  network: null,
  metadata: null,
  disk_mib: null,
  max_processes: null,
  tenant: DEFAULT_TENANT,
  policy: null,
  node_id: null,
  node_epoch: null,
} satisfies Partial<SandboxRow>;

/** What a create gives: the row without what the ledger fills in. */
export type NewSandboxRow = Omit<
  SandboxRow,
  keyof typeof SANDBOX_DEFAULTS | "created_at" | "updated_at" | "deleted_at" | "error"
> &
  Partial<Pick<SandboxRow, keyof typeof SANDBOX_DEFAULTS>>;

/** The columns of an insert, in order. */
const COLUMNS = [
  "id",
  "template",
  "template_hash",
  "driver",
  "acceleration",
  "vcpu",
  "memory_mib",
  "disk_mib",
  "max_processes",
  "state",
  "created_at",
  "updated_at",
  "deleted_at",
  "error",
  "expires_at",
  "delete_on_disconnect",
  "disconnect_grace_s",
  "network",
  "metadata",
  "tenant",
  "policy",
  "node_id",
  "node_epoch",
] as const satisfies ReadonlyArray<keyof SandboxRow>;

const INSERT = `INSERT INTO sandboxes (${COLUMNS.join(", ")}) VALUES (${COLUMNS.map(() => "?").join(", ")})`;

const now = (): string => new Date().toISOString();

/** Sandboxes (the lifecycle's rows) and the idempotency keys of their creates. */
export class SandboxQueries {
  *insertSandbox(row: NewSandboxRow, idempotency?: { key: string; fingerprint: string }): Step<SandboxRow> {
    if (!INITIAL_STATES.includes(row.state))
      throw new BothyError("internal", `A sandbox's row starts as creating or running, not ${row.state}.`);
    const t = now();
    const full: SandboxRow = {
      ...SANDBOX_DEFAULTS,
      ...row,
      created_at: t,
      updated_at: t,
      deleted_at: null,
      error: null,
    };
    yield* transaction(function* () {
      yield* run(
        INSERT,
        COLUMNS.map((c) => full[c]),
      );
      if (idempotency)
        yield* run(
          `INSERT INTO idempotency_keys (tenant, key, fingerprint, sandbox_id, created_at) VALUES (?, ?, ?, ?, ?)`,
          [full.tenant, idempotency.key, idempotency.fingerprint, row.id, t],
        );
    });
    return full;
  }

  /**
   * Moves a sandbox from `from` to `to` if, and only if, it is in `from` now (compare-and-set) and
   * the lifecycle table allows the move; otherwise throws a TransitionError and changes nothing.
   * `reason` (why it stopped or failed) is kept as the row's error. One UPDATE in both stores: its
   * WHERE is the compare, and a concurrent writer of the row waits for it (PostgreSQL) or cannot
   * run at all (SQLite's one writer).
   */
  *transition(id: string, from: SandboxState, to: SandboxState, reason?: string): Step<void> {
    if (!canTransition(from, to))
      throw new TransitionError("illegal", id, from, to, (yield* this.getSandbox(id))?.state);
    const t = now();
    const changed = yield* run(
      `UPDATE sandboxes SET state = ?, updated_at = ?, error = COALESCE(?, error), deleted_at = CASE WHEN ? = 'deleted' THEN ? ELSE deleted_at END WHERE id = ? AND state = ?`,
      [to, t, reason ?? null, to, t, id, from],
    );
    if (changed !== 1) throw new TransitionError("stale", id, from, to, (yield* this.getSandbox(id))?.state);
  }

  *getSandbox(id: string): Step<SandboxRow | undefined> {
    return yield* get<SandboxRow>(`SELECT * FROM sandboxes WHERE id = ?`, [id]);
  }

  *listSandboxes(options: { includeDeleted?: boolean } = {}): Step<SandboxRow[]> {
    return yield* all<SandboxRow>(
      options.includeDeleted
        ? `SELECT * FROM sandboxes ORDER BY created_at`
        : `SELECT * FROM sandboxes WHERE state NOT IN (${sqlStates("final")}) ORDER BY created_at`,
    );
  }

  *liveSandboxes(): Step<SandboxRow[]> {
    return yield* all<SandboxRow>(`SELECT * FROM sandboxes WHERE state IN (${sqlStates("live")})`);
  }

  *setExpiresAt(id: string, expiresAt: string): Step<void> {
    yield* run(`UPDATE sandboxes SET expires_at = ?, updated_at = ? WHERE id = ?`, [expiresAt, now(), id]);
  }

  /**
   * Sandboxes whose time ran out at `at` (an ISO time; ISO times of one format sort as text), asleep
   * or not: a `stopped` or `paused` one keeps its disk until it expires, as a running one keeps
   * its VM. Rows already `deleting` are the delete's own to finish.
   */
  *expiredSandboxes(at: string): Step<SandboxRow[]> {
    return yield* all<SandboxRow>(
      `SELECT * FROM sandboxes WHERE expires_at <= ? AND state IN (${sqlStates("expirable")})`,
      [at],
    );
  }

  *countByStateAndDriver(): Step<Array<{ state: string; driver: string; n: number }>> {
    return yield* all<{ state: string; driver: string; n: number }>(
      `SELECT state, driver, COUNT(*) AS n FROM sandboxes GROUP BY state, driver`,
    );
  }

  *countByState(): Step<Record<string, number>> {
    const rows = yield* all<{ state: string; n: number }>(`SELECT state, COUNT(*) AS n FROM sandboxes GROUP BY state`);
    return Object.fromEntries(rows.map((r) => [r.state, r.n]));
  }

  *findIdempotencyKey(tenant: string, key: string): Step<{ fingerprint: string; sandbox_id: string } | undefined> {
    return yield* get<{ fingerprint: string; sandbox_id: string }>(
      `SELECT fingerprint, sandbox_id FROM idempotency_keys WHERE tenant = ? AND key = ?`,
      [tenant, key],
    );
  }

  /** A failed create frees its key, so the client may retry with the same one. */
  *forgetIdempotencyKey(tenant: string, key: string): Step<void> {
    yield* run(`DELETE FROM idempotency_keys WHERE tenant = ? AND key = ?`, [tenant, key]);
  }

  /** The keys of a create the server did not live to finish: a retry with the same key makes a new sandbox. */
  *forgetIdempotencyKeysOf(sandboxId: string): Step<void> {
    yield* run(`DELETE FROM idempotency_keys WHERE sandbox_id = ?`, [sandboxId]);
  }
}
