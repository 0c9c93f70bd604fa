import type Database from "better-sqlite3";
import { sqlStates } from "../sandboxes/lifecycle.ts";

/** A vault secret as the ledger keeps it: the value only sealed (gateway/vault.ts). */
export interface SecretRow {
  tenant: string;
  name: string;
  /** nonce | tag | ciphertext (AES-256-GCM). */
  sealed: Buffer;
  /** JSON array of host patterns. */
  hosts: string;
  /** JSON `{header, format}` or null. */
  inject: string | null;
  created_at: string;
  updated_at: string;
}

export interface SandboxSecretRow {
  sandbox_id: string;
  name: string;
  env: string;
  placeholder: string;
}

/**
 * The vault's secrets and each sandbox's placeholders (tables of migration 11). A deleted or
 * failed sandbox keeps its placeholder rows for the record, but `bindings` no longer returns them.
 */
export class SecretRows {
  private readonly bindingsOf: Database.Statement;

  constructor(private readonly db: Database.Database) {
    this.bindingsOf = db.prepare(
      `SELECT b.sandbox_id, b.name, b.env, b.placeholder, s.tenant AS tenant, x.hosts, x.inject
         FROM sandbox_secrets b
         JOIN sandboxes s ON s.id = b.sandbox_id
         LEFT JOIN secrets x ON x.tenant = s.tenant AND x.name = b.name
        WHERE b.sandbox_id = ? AND s.state NOT IN (${sqlStates("final")})
        ORDER BY b.name`,
    );
  }

  get(tenant: string, name: string): SecretRow | undefined {
    return this.db.prepare(`SELECT * FROM secrets WHERE tenant = ? AND name = ?`).get(tenant, name) as
      SecretRow | undefined;
  }

  /** Every tenant's when `tenant` is undefined. */
  list(tenant?: string): SecretRow[] {
    return (
      tenant === undefined
        ? this.db.prepare(`SELECT * FROM secrets ORDER BY tenant, name`).all()
        : this.db.prepare(`SELECT * FROM secrets WHERE tenant = ? ORDER BY name`).all(tenant)
    ) as SecretRow[];
  }

  /** Inserts or replaces; true when the secret is new. */
  put(row: Omit<SecretRow, "created_at" | "updated_at">): boolean {
    const now = new Date().toISOString();
    return this.db.transaction(() => {
      const existed = this.get(row.tenant, row.name) !== undefined;
      this.db
        .prepare(
          `INSERT INTO secrets (tenant, name, sealed, hosts, inject, created_at, updated_at)
           VALUES (@tenant, @name, @sealed, @hosts, @inject, @now, @now)
           ON CONFLICT(tenant, name) DO UPDATE SET sealed = @sealed, hosts = @hosts, inject = @inject, updated_at = @now`,
        )
        .run({ ...row, now });
      return !existed;
    })();
  }

  delete(tenant: string, name: string): boolean {
    return this.db.prepare(`DELETE FROM secrets WHERE tenant = ? AND name = ?`).run(tenant, name).changes === 1;
  }

  /** Names of `names` the tenant's vault lacks. */
  missing(tenant: string, names: string[]): string[] {
    return names.filter((n) => this.get(tenant, n) === undefined);
  }

  /** A sandbox's placeholders, written together or not at all. */
  bind(rows: SandboxSecretRow[]): void {
    const insert = this.db.prepare(
      `INSERT INTO sandbox_secrets (sandbox_id, name, env, placeholder) VALUES (@sandbox_id, @name, @env, @placeholder)`,
    );
    this.db.transaction(() => {
      for (const row of rows) insert.run(row);
    })();
  }

  /**
   * The live sandbox's placeholders with their secret's hosts and inject; `hosts` is null where
   * the secret was deleted from the vault since.
   */
  bindings(
    sandboxId: string,
  ): Array<SandboxSecretRow & { tenant: string; hosts: string | null; inject: string | null }> {
    return this.bindingsOf.all(sandboxId) as Array<
      SandboxSecretRow & { tenant: string; hosts: string | null; inject: string | null }
    >;
  }
}
