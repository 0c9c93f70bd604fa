import { get, run, type Step, type Asynced } from "./sql-step.ts";

/** A dashboard session as the ledger keeps it: a digest of its id, never the id itself. */
export interface SessionRow {
  /** SHA-256 of the session id, hex. */
  digest: string;
  key_id: string;
  created_at: string;
  expires_at: string;
}

/** The dashboard's sessions (table of migration 14); every request reads its row, so a sign-out ends it at once. */
export class SessionQueries {
  *insert(row: SessionRow): Step<void> {
    yield* run(`INSERT INTO ui_sessions (digest, key_id, created_at, expires_at) VALUES (?, ?, ?, ?)`, [
      row.digest,
      row.key_id,
      row.created_at,
      row.expires_at,
    ]);
  }

  *get(digest: string): Step<SessionRow | undefined> {
    return yield* get<SessionRow>(`SELECT * FROM ui_sessions WHERE digest = ?`, [digest]);
  }

  *remove(digest: string): Step<boolean> {
    return (yield* run(`DELETE FROM ui_sessions WHERE digest = ?`, [digest])) > 0;
  }

  /** Drops sessions past their expiry or of keys that are revoked; returns how many. */
  *prune(nowIso: string): Step<number> {
    return yield* run(
      `DELETE FROM ui_sessions WHERE expires_at <= ? OR key_id IN (SELECT id FROM api_keys WHERE revoked_at IS NOT NULL)`,
      [nowIso],
    );
  }
}

/** The dashboard's sessions as the server's synchronous callers see them. */
export type SessionRows = Asynced<SessionQueries>;
