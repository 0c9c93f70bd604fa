import Database from "better-sqlite3";
import type { NetworkPolicy, SandboxInfo } from "@bothy/protocol";
import { translateMigration } from "./dialect.ts";
import { MIGRATIONS } from "./migrations.ts";
import type { SandboxRow } from "./sandbox-rows.ts";

export { MIGRATIONS } from "./migrations.ts";
export { DEFAULT_TENANT, type SandboxRow } from "./sandbox-rows.ts";
export type { CommandRow } from "./command-rows.ts";
export type { EventRow } from "./event-rows.ts";

/**
 * A SQLite ledger file as the SQLite store uses it: WAL, foreign keys enforced, and every write
 * about sandboxes durable before it returns (synchronous=FULL); command records, events and a
 * key's last use are written relaxed (`relaxed` in sql-step.ts: synchronous=NORMAL, so a crash of
 * bothy itself loses none of them, the WAL holds them; a crash of the host's kernel or a power cut
 * may lose the last few, which the next durable write would have carried to the disk with it).
 */
export function openSqlite(path: string): Database.Database {
  const db = new Database(path);
  db.pragma("journal_mode = WAL");
  db.pragma("synchronous = FULL");
  db.pragma("foreign_keys = ON");
  db.pragma("busy_timeout = 5000");
  return db;
}

/** Runs the migrations a SQLite ledger lacks, each in its own transaction; `PRAGMA user_version` counts them. */
export function migrateSqlite(db: Database.Database): void {
  const version = db.pragma("user_version", { simple: true }) as number;
  for (let i = version; i < MIGRATIONS.length; i++) {
    db.transaction(() => {
      db.exec(translateMigration(MIGRATIONS[i] ?? "", "sqlite"));
      db.pragma(`user_version = ${i + 1}`);
    })();
  }
}

export function toSandboxInfo(row: SandboxRow): SandboxInfo {
  return {
    sandbox_id: row.id,
    metadata: row.metadata === null ? {} : (JSON.parse(row.metadata) as Record<string, string>),
    state: row.state,
    template: row.template,
    driver: row.driver,
    acceleration: row.acceleration,
    vcpu: row.vcpu,
    memory_mib: row.memory_mib,
    disk_mib: row.disk_mib,
    max_processes: row.max_processes,
    created_at: row.created_at,
    deleted_at: row.deleted_at,
    expires_at: row.expires_at,
    delete_on_disconnect: row.delete_on_disconnect === 1,
    network: row.network === null ? null : (JSON.parse(row.network) as NetworkPolicy),
    error: row.error,
  };
}
