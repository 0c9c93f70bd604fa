import type Database from "better-sqlite3";

/** A dashboard session as the ledger keeps it: a digest of its id, never the id itself. */
export interface SessionRow {
  /** SHA-256 of the session id, hex. */
  digest: string;
  key_id: string;
  created_at: string;
  expires_at: string;
}

/** The dashboard's sessions (table of migration 14); every request reads its row, so a sign-out ends it at once. */
export class SessionRows {
  private readonly byDigest: Database.Statement;

  constructor(private readonly db: Database.Database) {
    this.byDigest = db.prepare(`SELECT * FROM ui_sessions WHERE digest = ?`);
  }

  insert(row: SessionRow): void {
    this.db
      .prepare(
        `INSERT INTO ui_sessions (digest, key_id, created_at, expires_at) VALUES (@digest, @key_id, @created_at, @expires_at)`,
      )
      .run(row);
  }

  get(digest: string): SessionRow | undefined {
    return this.byDigest.get(digest) as SessionRow | undefined;
  }

  remove(digest: string): boolean {
    return this.db.prepare(`DELETE FROM ui_sessions WHERE digest = ?`).run(digest).changes > 0;
  }

  /** Drops sessions past their expiry or of keys that are revoked; returns how many. */
  prune(nowIso: string): number {
    return this.db
      .prepare(
        `DELETE FROM ui_sessions WHERE expires_at <= ? OR key_id IN (SELECT id FROM api_keys WHERE revoked_at IS NOT NULL)`,
      )
      .run(nowIso).changes;
  }
}
