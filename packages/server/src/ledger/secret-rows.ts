import { all, get, run, transaction, type Step, type Asynced } from "./sql-step.ts";
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
export class SecretQueries {
  /**
   * The vault key's fingerprint the ledger recorded first: `fingerprint` itself when it had none.
   * Every node of a shared database must hold the key whose fingerprint this is.
   */
  *vaultFingerprint(fingerprint: string, at: string): Step<string> {
    yield* run(`INSERT INTO vault_check (id, fingerprint, created_at) VALUES (1, ?, ?) ON CONFLICT (id) DO NOTHING`, [
      fingerprint,
      at,
    ]);
    return (
      (yield* get<{ fingerprint: string }>(`SELECT fingerprint FROM vault_check WHERE id = 1`))?.fingerprint ??
      fingerprint
    );
  }

  *get(tenant: string, name: string): Step<SecretRow | undefined> {
    return yield* get<SecretRow>(`SELECT * FROM secrets WHERE tenant = ? AND name = ?`, [tenant, name]);
  }

  /** Every tenant's when `tenant` is undefined. */
  *list(tenant?: string): Step<SecretRow[]> {
    return tenant === undefined
      ? yield* all<SecretRow>(`SELECT * FROM secrets ORDER BY tenant, name`)
      : yield* all<SecretRow>(`SELECT * FROM secrets WHERE tenant = ? ORDER BY name`, [tenant]);
  }

  /** Inserts or replaces; true when the secret is new. */
  *put(row: Omit<SecretRow, "created_at" | "updated_at">): Step<boolean> {
    const now = new Date().toISOString();
    return yield* transaction(function* () {
      const existed =
        (yield* get(`SELECT 1 FROM secrets WHERE tenant = ? AND name = ? FOR UPDATE`, [row.tenant, row.name])) !==
        undefined;
      yield* run(
        `INSERT INTO secrets (tenant, name, sealed, hosts, inject, created_at, updated_at)
           VALUES (?, ?, ?, ?, ?, ?, ?)
           ON CONFLICT(tenant, name) DO UPDATE SET sealed = excluded.sealed, hosts = excluded.hosts, inject = excluded.inject, updated_at = excluded.updated_at`,
        [row.tenant, row.name, row.sealed, row.hosts, row.inject, now, now],
      );
      return !existed;
    });
  }

  *delete(tenant: string, name: string): Step<boolean> {
    return (yield* run(`DELETE FROM secrets WHERE tenant = ? AND name = ?`, [tenant, name])) === 1;
  }

  /** Names of `names` the tenant's vault lacks. */
  *missing(tenant: string, names: string[]): Step<string[]> {
    const missing: string[] = [];
    for (const n of names) if ((yield* this.get(tenant, n)) === undefined) missing.push(n);
    return missing;
  }

  /** A sandbox's placeholders, written together or not at all. */
  *bind(rows: SandboxSecretRow[]): Step<void> {
    yield* transaction(function* () {
      for (const row of rows)
        yield* run(`INSERT INTO sandbox_secrets (sandbox_id, name, env, placeholder) VALUES (?, ?, ?, ?)`, [
          row.sandbox_id,
          row.name,
          row.env,
          row.placeholder,
        ]);
    });
  }

  /**
   * The live sandbox's placeholders with their secret's hosts and inject; `hosts` is null where
   * the secret was deleted from the vault since.
   */
  *bindings(
    sandboxId: string,
  ): Step<Array<SandboxSecretRow & { tenant: string; hosts: string | null; inject: string | null }>> {
    return yield* all<SandboxSecretRow & { tenant: string; hosts: string | null; inject: string | null }>(
      `SELECT b.sandbox_id, b.name, b.env, b.placeholder, s.tenant AS tenant, x.hosts, x.inject
         FROM sandbox_secrets b
         JOIN sandboxes s ON s.id = b.sandbox_id
         LEFT JOIN secrets x ON x.tenant = s.tenant AND x.name = b.name
        WHERE b.sandbox_id = ? AND s.state NOT IN (${sqlStates("final")})
        ORDER BY b.name`,
      [sandboxId],
    );
  }
}

/** The vault's rows as the server's synchronous callers see them. */
export type SecretRows = Asynced<SecretQueries>;
