import { all, get, notify, relaxed, run, transaction, type Step, type Asynced } from "./sql-step.ts";
import { sqlStates } from "../sandboxes/lifecycle.ts";

/** The channel a key's revocation notifies (its id as payload): other nodes end its open connections. */
export const KEYS_CHANNEL = "bothy_keys";

export interface TenantRow {
  id: string;
  /** JSON of protocol's tenantQuota. */
  quota: string;
  created_at: string;
}

/** What keeps a tenant from being deleted: counts of its live sandboxes, unrevoked keys and stored data. */
export interface TenantHoldings {
  sandboxes: number;
  keys: number;
  secrets: number;
  volumes: number;
  snapshots: number;
}

export interface ApiKeyRow {
  id: string;
  tenant: string;
  name: string;
  /** HMAC-SHA256 of the key with the server's pepper, hex; the key itself is never stored. */
  digest: string;
  prefix: string;
  last4: string;
  /** Comma-separated scopes. */
  scopes: string;
  created_at: string;
  expires_at: string | null;
  revoked_at: string | null;
  last_used_at: string | null;
}

/** The ledger's tenants and API keys (tables of migration 10). */
export class AuthQueries {
  *tenant(id: string): Step<TenantRow | undefined> {
    return yield* get<TenantRow>(`SELECT * FROM tenants WHERE id = ?`, [id]);
  }

  *tenants(): Step<TenantRow[]> {
    return yield* all<TenantRow>(`SELECT * FROM tenants ORDER BY created_at, id`);
  }

  /** False when a tenant of that id exists already. */
  *insertTenant(id: string, quota: string): Step<boolean> {
    return (
      (yield* run(`INSERT INTO tenants (id, quota, created_at) VALUES (?, ?, ?) ON CONFLICT(id) DO NOTHING`, [
        id,
        quota,
        new Date().toISOString(),
      ])) === 1
    );
  }

  /**
   * Deletes a tenant that holds nothing (see TenantHoldings): its revoked keys and their sessions go
   * with it, its history (deleted sandboxes, events, usage, approvals) stays under its name. Answers
   * what it still holds instead when that is anything, undefined for no such tenant.
   */
  *deleteTenant(id: string): Step<TenantHoldings | "deleted" | undefined> {
    return yield* transaction(function* () {
      if (!(yield* get(`SELECT id FROM tenants WHERE id = ? FOR UPDATE`, [id]))) return undefined;
      const count = function* (sql: string): Step<number> {
        return Number((yield* get<{ n: number | string }>(sql, [id]))?.n ?? 0);
      };
      const holdings: TenantHoldings = {
        sandboxes: yield* count(
          `SELECT COUNT(*) AS n FROM sandboxes WHERE tenant = ? AND state IN (${sqlStates("live")})`,
        ),
        keys: yield* count(`SELECT COUNT(*) AS n FROM api_keys WHERE tenant = ? AND revoked_at IS NULL`),
        secrets: yield* count(`SELECT COUNT(*) AS n FROM secrets WHERE tenant = ?`),
        volumes: yield* count(`SELECT COUNT(*) AS n FROM volumes WHERE tenant = ?`),
        snapshots: yield* count(`SELECT COUNT(*) AS n FROM snapshots WHERE tenant = ?`),
      };
      if (Object.values(holdings).some((n) => n > 0)) return holdings;
      yield* run(`DELETE FROM ui_sessions WHERE key_id IN (SELECT id FROM api_keys WHERE tenant = ?)`, [id]);
      yield* run(`DELETE FROM api_keys WHERE tenant = ?`, [id]);
      yield* run(`DELETE FROM tenants WHERE id = ?`, [id]);
      return "deleted";
    });
  }

  /**
   * Whether rows of a tenant's past remain under this name (a deleted tenant's sandboxes, events or
   * usage): a new tenant of that name would read them, so the name is not given again.
   */
  *tenantHasHistory(id: string): Step<boolean> {
    const row = yield* get(
      `SELECT 1 AS found WHERE EXISTS (SELECT 1 FROM sandboxes WHERE tenant = ?)
          OR EXISTS (SELECT 1 FROM events WHERE tenant = ?)
          OR EXISTS (SELECT 1 FROM usage_day WHERE owner = ?)
          OR EXISTS (SELECT 1 FROM approvals WHERE tenant = ?)`,
      [id, id, id, id],
    );
    return row !== undefined;
  }

  /** The tenant's default host policy (JSON), null when it has none, undefined for no such tenant. */
  *tenantPolicy(id: string): Step<string | null | undefined> {
    return (yield* get<{ policy: string | null }>(`SELECT policy FROM tenants WHERE id = ?`, [id]))?.policy;
  }

  *setTenantPolicy(id: string, policy: string | null): Step<void> {
    yield* run(`UPDATE tenants SET policy = ? WHERE id = ?`, [policy, id]);
  }

  *setQuota(id: string, quota: string): Step<void> {
    yield* run(`UPDATE tenants SET quota = ? WHERE id = ?`, [quota, id]);
  }

  *insertKey(row: Omit<ApiKeyRow, "revoked_at" | "last_used_at">): Step<void> {
    yield* run(
      `INSERT INTO api_keys (id, tenant, name, digest, prefix, last4, scopes, created_at, expires_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      [row.id, row.tenant, row.name, row.digest, row.prefix, row.last4, row.scopes, row.created_at, row.expires_at],
    );
  }

  *keyByDigest(digest: string): Step<ApiKeyRow | undefined> {
    return yield* get<ApiKeyRow>(`SELECT * FROM api_keys WHERE digest = ?`, [digest]);
  }

  *key(id: string): Step<ApiKeyRow | undefined> {
    return yield* get<ApiKeyRow>(`SELECT * FROM api_keys WHERE id = ?`, [id]);
  }

  /** A tenant's keys, or every key (tenant undefined). */
  *keys(tenant?: string): Step<ApiKeyRow[]> {
    return tenant === undefined
      ? yield* all<ApiKeyRow>(`SELECT * FROM api_keys ORDER BY created_at, id`)
      : yield* all<ApiKeyRow>(`SELECT * FROM api_keys WHERE tenant = ? ORDER BY created_at, id`, [tenant]);
  }

  *countKeys(): Step<number> {
    return (yield* get<{ n: number }>(`SELECT COUNT(*) AS n FROM api_keys`))?.n ?? 0;
  }

  /** False when it was revoked already. Tells the other nodes (KEYS_CHANNEL) either way. */
  *revokeKey(id: string): Step<boolean> {
    const changed =
      (yield* run(`UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL`, [
        new Date().toISOString(),
        id,
      ])) === 1;
    yield* notify(KEYS_CHANNEL, id);
    return changed;
  }

  /** Written without waiting for the disk: losing the last few in a power cut costs nothing. */
  *touchKey(id: string, at: string): Step<void> {
    yield* relaxed(() => run(`UPDATE api_keys SET last_used_at = ? WHERE id = ?`, [at, id]));
  }

  /** Live sandboxes of a tenant, with their size, for its quotas. */
  *liveUsage(tenant: string): Step<{ sandboxes: number; vcpu: number; memory_mib: number }> {
    const row = yield* get<{ sandboxes: number; vcpu: number; memory_mib: number }>(
      `SELECT COUNT(*) AS sandboxes, COALESCE(SUM(vcpu), 0) AS vcpu, COALESCE(SUM(memory_mib), 0) AS memory_mib
         FROM sandboxes WHERE tenant = ? AND state IN (${sqlStates("active")})`,
      [tenant],
    );
    return row ?? { sandboxes: 0, vcpu: 0, memory_mib: 0 };
  }

  /** Creates of a tenant since `since` (ISO time), failed ones included. */
  *createsSince(tenant: string, since: string): Step<number> {
    return (
      (yield* get<{ n: number }>(`SELECT COUNT(*) AS n FROM sandboxes WHERE tenant = ? AND created_at >= ?`, [
        tenant,
        since,
      ]))?.n ?? 0
    );
  }

  *sandboxIdsOf(tenant: string): Step<Set<string>> {
    const rows = yield* all<{ id: string }>(`SELECT id FROM sandboxes WHERE tenant = ?`, [tenant]);
    return new Set(rows.map((r) => r.id));
  }

  *sandboxTenant(id: string): Step<string | undefined> {
    return (yield* get<{ tenant: string }>(`SELECT tenant FROM sandboxes WHERE id = ?`, [id]))?.tenant;
  }
}

/** Tenants and API keys as the server's synchronous callers see them. */
export type AuthRows = Asynced<AuthQueries>;
