import type Database from "better-sqlite3";
import { sqlStates } from "../sandboxes/lifecycle.ts";

export interface TenantRow {
  id: string;
  /** JSON of protocol's tenantQuota. */
  quota: string;
  created_at: string;
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
export class AuthRows {
  /** Statements of every request, prepared once. */
  private readonly byDigest: Database.Statement;
  private readonly tenantOf: Database.Statement;
  private readonly policyOfTenant: Database.Statement;

  constructor(private readonly db: Database.Database) {
    this.byDigest = db.prepare(`SELECT * FROM api_keys WHERE digest = ?`);
    this.tenantOf = db.prepare(`SELECT tenant FROM sandboxes WHERE id = ?`);
    this.policyOfTenant = db.prepare(`SELECT policy FROM tenants WHERE id = ?`);
  }

  tenant(id: string): TenantRow | undefined {
    return this.db.prepare(`SELECT * FROM tenants WHERE id = ?`).get(id) as TenantRow | undefined;
  }

  tenants(): TenantRow[] {
    return this.db.prepare(`SELECT * FROM tenants ORDER BY created_at, id`).all() as TenantRow[];
  }

  /** False when a tenant of that id exists already. */
  insertTenant(id: string, quota: string): boolean {
    return (
      this.db
        .prepare(`INSERT INTO tenants (id, quota, created_at) VALUES (?, ?, ?) ON CONFLICT(id) DO NOTHING`)
        .run(id, quota, new Date().toISOString()).changes === 1
    );
  }

  /** The tenant's default host policy (JSON), null when it has none, undefined for no such tenant. */
  tenantPolicy(id: string): string | null | undefined {
    const row = this.policyOfTenant.get(id) as { policy: string | null } | undefined;
    return row?.policy;
  }

  setTenantPolicy(id: string, policy: string | null): void {
    this.db.prepare(`UPDATE tenants SET policy = ? WHERE id = ?`).run(policy, id);
  }

  setQuota(id: string, quota: string): void {
    this.db.prepare(`UPDATE tenants SET quota = ? WHERE id = ?`).run(quota, id);
  }

  insertKey(row: Omit<ApiKeyRow, "revoked_at" | "last_used_at">): void {
    this.db
      .prepare(
        `INSERT INTO api_keys (id, tenant, name, digest, prefix, last4, scopes, created_at, expires_at)
         VALUES (@id, @tenant, @name, @digest, @prefix, @last4, @scopes, @created_at, @expires_at)`,
      )
      .run(row);
  }

  keyByDigest(digest: string): ApiKeyRow | undefined {
    return this.byDigest.get(digest) as ApiKeyRow | undefined;
  }

  key(id: string): ApiKeyRow | undefined {
    return this.db.prepare(`SELECT * FROM api_keys WHERE id = ?`).get(id) as ApiKeyRow | undefined;
  }

  /** A tenant's keys, or every key (tenant undefined). */
  keys(tenant?: string): ApiKeyRow[] {
    return (
      tenant === undefined
        ? this.db.prepare(`SELECT * FROM api_keys ORDER BY created_at, id`).all()
        : this.db.prepare(`SELECT * FROM api_keys WHERE tenant = ? ORDER BY created_at, id`).all(tenant)
    ) as ApiKeyRow[];
  }

  countKeys(): number {
    return (this.db.prepare(`SELECT COUNT(*) AS n FROM api_keys`).get() as { n: number }).n;
  }

  /** False when it was revoked already. */
  revokeKey(id: string): boolean {
    return (
      this.db
        .prepare(`UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL`)
        .run(new Date().toISOString(), id).changes === 1
    );
  }

  /** Written without waiting for the disk: losing the last few in a power cut costs nothing. */
  touchKey(id: string, at: string): void {
    this.db.pragma("synchronous = NORMAL");
    try {
      this.db.prepare(`UPDATE api_keys SET last_used_at = ? WHERE id = ?`).run(at, id);
    } finally {
      this.db.pragma("synchronous = FULL");
    }
  }

  /** Live sandboxes of a tenant, with their size, for its quotas. */
  liveUsage(tenant: string): { sandboxes: number; vcpu: number; memory_mib: number } {
    return this.db
      .prepare(
        `SELECT COUNT(*) AS sandboxes, COALESCE(SUM(vcpu), 0) AS vcpu, COALESCE(SUM(memory_mib), 0) AS memory_mib
         FROM sandboxes WHERE tenant = ? AND state IN (${sqlStates("active")})`,
      )
      .get(tenant) as { sandboxes: number; vcpu: number; memory_mib: number };
  }

  /** Creates of a tenant since `since` (ISO time), failed ones included. */
  createsSince(tenant: string, since: string): number {
    return (
      this.db
        .prepare(`SELECT COUNT(*) AS n FROM sandboxes WHERE tenant = ? AND created_at >= ?`)
        .get(tenant, since) as {
        n: number;
      }
    ).n;
  }

  sandboxIdsOf(tenant: string): Set<string> {
    const rows = this.db.prepare(`SELECT id FROM sandboxes WHERE tenant = ?`).all(tenant) as Array<{ id: string }>;
    return new Set(rows.map((r) => r.id));
  }

  sandboxTenant(id: string): string | undefined {
    return (this.tenantOf.get(id) as { tenant: string } | undefined)?.tenant;
  }
}
