/**
 * The agent tools' own SQLite file (`$BOTHY_HOME/tools/tools.sqlite`), separate from the
 * server's ledger: conversations and their sandbox, turns, what each turn read (for the
 * read-before-edit guard), exports and what each turn sent, and the corpus with its FTS5 index.
 */
import { randomBytes } from "node:crypto";
import Database from "better-sqlite3";

const ALPHABET = "abcdefghijklmnopqrstuvwxyz234567";
export function newId(prefix: string): string {
  let out = `${prefix}_`;
  for (const b of randomBytes(20)) out += ALPHABET[b & 31];
  return out;
}

/** Each entry migrates user_version i to i+1; append only. */
const MIGRATIONS: string[] = [
  `CREATE TABLE conversations (
     id TEXT PRIMARY KEY,
     template TEXT NOT NULL,
     vcpu INTEGER,
     memory_mib INTEGER,
     sandbox_id TEXT,
     current_turn TEXT,
     created_at TEXT NOT NULL,
     deleted_at TEXT
   );
   CREATE TABLE turns (
     conversation_id TEXT NOT NULL,
     turn_id TEXT NOT NULL,
     state TEXT NOT NULL CHECK (state IN ('open','ended')),
     started_at TEXT NOT NULL,
     ended_at TEXT,
     warnings TEXT NOT NULL DEFAULT '[]',
     PRIMARY KEY (conversation_id, turn_id)
   );
   CREATE TABLE reads (
     conversation_id TEXT NOT NULL,
     turn_id TEXT NOT NULL,
     path TEXT NOT NULL,
     sha256 TEXT NOT NULL,
     full INTEGER NOT NULL,
     read_at TEXT NOT NULL,
     PRIMARY KEY (conversation_id, turn_id, path)
   );
   CREATE TABLE exports (
     id TEXT PRIMARY KEY,
     conversation_id TEXT NOT NULL,
     turn_id TEXT NOT NULL,
     source_path TEXT NOT NULL,
     name TEXT NOT NULL,
     size INTEGER NOT NULL,
     media_type TEXT NOT NULL,
     sha256 TEXT NOT NULL,
     created_at TEXT NOT NULL
   );
   CREATE TABLE attachments (
     conversation_id TEXT NOT NULL,
     turn_id TEXT NOT NULL,
     export_id TEXT NOT NULL,
     sent_at TEXT NOT NULL,
     PRIMARY KEY (conversation_id, turn_id, export_id)
   );
   CREATE TABLE documents (
     id TEXT PRIMARY KEY,
     name TEXT NOT NULL,
     media_type TEXT NOT NULL,
     size INTEGER NOT NULL,
     sha256 TEXT NOT NULL,
     lines INTEGER NOT NULL,
     created_at TEXT NOT NULL
   );
   CREATE VIRTUAL TABLE passages USING fts5(
     text, document_id UNINDEXED, start_line UNINDEXED, end_line UNINDEXED, tokenize = 'porter unicode61'
   );`,
  // Checkpoints (computer_checkpoint): the snapshots a conversation took, which it alone may restore.
  `CREATE TABLE checkpoints (
     snapshot_id TEXT PRIMARY KEY,
     conversation_id TEXT NOT NULL,
     label TEXT,
     created_at TEXT NOT NULL
   );
   CREATE INDEX checkpoints_by_conversation ON checkpoints (conversation_id);`,
];

export interface ConversationRow {
  id: string;
  template: string;
  vcpu: number | null;
  memory_mib: number | null;
  sandbox_id: string | null;
  current_turn: string | null;
  created_at: string;
  deleted_at: string | null;
}

export interface CheckpointRow {
  snapshot_id: string;
  conversation_id: string;
  label: string | null;
  created_at: string;
}

export interface TurnRow {
  conversation_id: string;
  turn_id: string;
  state: "open" | "ended";
  started_at: string;
  ended_at: string | null;
  warnings: string[];
}

export interface ReadRecord {
  sha256: string;
  full: boolean;
}

export interface ExportRow {
  id: string;
  conversation_id: string;
  turn_id: string;
  source_path: string;
  name: string;
  size: number;
  media_type: string;
  sha256: string;
  created_at: string;
}

export interface DocumentRow {
  id: string;
  name: string;
  media_type: string;
  size: number;
  sha256: string;
  lines: number;
  created_at: string;
}

export interface Passage {
  text: string;
  start_line: number;
  end_line: number;
}

export interface SearchHit extends Passage {
  document_id: string;
  rank: number;
}

const now = (): string => new Date().toISOString();

export class ToolStore {
  private readonly db: Database.Database;

  constructor(file: string) {
    this.db = new Database(file);
    this.db.pragma("journal_mode = WAL");
    this.db.pragma("synchronous = FULL");
    const version = this.db.pragma("user_version", { simple: true }) as number;
    for (let v = version; v < MIGRATIONS.length; v++) {
      this.db.transaction(() => {
        this.db.exec(MIGRATIONS[v] ?? "");
        this.db.pragma(`user_version = ${v + 1}`);
      })();
    }
  }

  close(): void {
    this.db.close();
  }

  // ---- conversations and turns ----------------------------------------------------------------

  conversation(id: string): ConversationRow | undefined {
    return this.db.prepare(`SELECT * FROM conversations WHERE id = ?`).get(id) as ConversationRow | undefined;
  }

  /** Inserts the conversation unless it exists; answers the row either way. */
  ensureConversation(
    id: string,
    shape: { template: string; vcpu?: number | undefined; memory_mib?: number | undefined },
  ): ConversationRow {
    this.db
      .prepare(
        `INSERT OR IGNORE INTO conversations (id, template, vcpu, memory_mib, created_at) VALUES (?, ?, ?, ?, ?)`,
      )
      .run(id, shape.template, shape.vcpu ?? null, shape.memory_mib ?? null, now());
    const row = this.conversation(id);
    if (!row) throw new Error(`conversation ${id} vanished`);
    return row;
  }

  setSandbox(conversationId: string, sandboxId: string | null): void {
    this.db.prepare(`UPDATE conversations SET sandbox_id = ? WHERE id = ?`).run(sandboxId, conversationId);
  }

  markDeleted(conversationId: string): void {
    this.db
      .prepare(`UPDATE conversations SET sandbox_id = NULL, deleted_at = ? WHERE id = ?`)
      .run(now(), conversationId);
  }

  addCheckpoint(row: Omit<CheckpointRow, "created_at">): CheckpointRow {
    const created_at = now();
    this.db
      .prepare(`INSERT INTO checkpoints (snapshot_id, conversation_id, label, created_at) VALUES (?, ?, ?, ?)`)
      .run(row.snapshot_id, row.conversation_id, row.label, created_at);
    return { ...row, created_at };
  }

  /** The conversation's checkpoint of that id; another conversation's is as absent as none. */
  checkpoint(conversationId: string, snapshotId: string): CheckpointRow | undefined {
    return this.db
      .prepare(`SELECT * FROM checkpoints WHERE conversation_id = ? AND snapshot_id = ?`)
      .get(conversationId, snapshotId) as CheckpointRow | undefined;
  }

  checkpoints(conversationId: string): CheckpointRow[] {
    return this.db
      .prepare(`SELECT * FROM checkpoints WHERE conversation_id = ? ORDER BY created_at, rowid`)
      .all(conversationId) as CheckpointRow[];
  }

  removeCheckpoint(snapshotId: string): void {
    this.db.prepare(`DELETE FROM checkpoints WHERE snapshot_id = ?`).run(snapshotId);
  }

  turn(conversationId: string, turnId: string): TurnRow | undefined {
    const row = this.db
      .prepare(`SELECT * FROM turns WHERE conversation_id = ? AND turn_id = ?`)
      .get(conversationId, turnId) as (Omit<TurnRow, "warnings"> & { warnings: string }) | undefined;
    return row && { ...row, warnings: JSON.parse(row.warnings) as string[] };
  }

  turns(conversationId: string): TurnRow[] {
    const rows = this.db
      .prepare(`SELECT * FROM turns WHERE conversation_id = ? ORDER BY started_at, rowid`)
      .all(conversationId) as Array<Omit<TurnRow, "warnings"> & { warnings: string }>;
    return rows.map((r) => ({ ...r, warnings: JSON.parse(r.warnings) as string[] }));
  }

  beginTurn(conversationId: string, turnId: string): void {
    this.db.transaction(() => {
      this.db
        .prepare(`INSERT INTO turns (conversation_id, turn_id, state, started_at) VALUES (?, ?, 'open', ?)`)
        .run(conversationId, turnId, now());
      this.db.prepare(`UPDATE conversations SET current_turn = ? WHERE id = ?`).run(turnId, conversationId);
    })();
  }

  endTurn(conversationId: string, turnId: string, warnings: string[]): void {
    this.db.transaction(() => {
      this.db
        .prepare(
          `UPDATE turns SET state = 'ended', ended_at = ?, warnings = ? WHERE conversation_id = ? AND turn_id = ?`,
        )
        .run(now(), JSON.stringify(warnings), conversationId, turnId);
      this.db
        .prepare(`UPDATE conversations SET current_turn = NULL WHERE id = ? AND current_turn = ?`)
        .run(conversationId, turnId);
    })();
  }

  // ---- reads --------------------------------------------------------------------------------

  recordRead(conversationId: string, turnId: string, path: string, read: ReadRecord): void {
    this.db
      .prepare(
        `INSERT OR REPLACE INTO reads (conversation_id, turn_id, path, sha256, full, read_at) VALUES (?, ?, ?, ?, ?, ?)`,
      )
      .run(conversationId, turnId, path, read.sha256, read.full ? 1 : 0, now());
  }

  read(conversationId: string, turnId: string, path: string): ReadRecord | undefined {
    const row = this.db
      .prepare(`SELECT sha256, full FROM reads WHERE conversation_id = ? AND turn_id = ? AND path = ?`)
      .get(conversationId, turnId, path) as { sha256: string; full: number } | undefined;
    return row && { sha256: row.sha256, full: row.full === 1 };
  }

  // ---- exports and attachments --------------------------------------------------------------

  addExport(row: ExportRow): void {
    this.db
      .prepare(
        `INSERT INTO exports (id, conversation_id, turn_id, source_path, name, size, media_type, sha256, created_at) VALUES (@id, @conversation_id, @turn_id, @source_path, @name, @size, @media_type, @sha256, @created_at)`,
      )
      .run(row);
  }

  export(id: string): ExportRow | undefined {
    return this.db.prepare(`SELECT * FROM exports WHERE id = ?`).get(id) as ExportRow | undefined;
  }

  exportsOfTurn(conversationId: string, turnId: string): ExportRow[] {
    return this.db
      .prepare(`SELECT * FROM exports WHERE conversation_id = ? AND turn_id = ? ORDER BY created_at, rowid`)
      .all(conversationId, turnId) as ExportRow[];
  }

  attach(conversationId: string, turnId: string, exportId: string): void {
    this.db
      .prepare(`INSERT OR IGNORE INTO attachments (conversation_id, turn_id, export_id, sent_at) VALUES (?, ?, ?, ?)`)
      .run(conversationId, turnId, exportId, now());
  }

  attachments(conversationId: string, turnId: string): Array<ExportRow & { sent_at: string }> {
    return this.db
      .prepare(
        `SELECT e.*, a.sent_at FROM attachments a JOIN exports e ON e.id = a.export_id WHERE a.conversation_id = ? AND a.turn_id = ? ORDER BY a.sent_at, a.rowid`,
      )
      .all(conversationId, turnId) as Array<ExportRow & { sent_at: string }>;
  }

  // ---- corpus -------------------------------------------------------------------------------

  addDocument(doc: DocumentRow, passages: Passage[]): void {
    this.db.transaction(() => {
      this.db
        .prepare(
          `INSERT INTO documents (id, name, media_type, size, sha256, lines, created_at) VALUES (@id, @name, @media_type, @size, @sha256, @lines, @created_at)`,
        )
        .run(doc);
      const insert = this.db.prepare(
        `INSERT INTO passages (text, document_id, start_line, end_line) VALUES (?, ?, ?, ?)`,
      );
      for (const p of passages) insert.run(p.text, doc.id, p.start_line, p.end_line);
    })();
  }

  document(id: string): DocumentRow | undefined {
    return this.db.prepare(`SELECT * FROM documents WHERE id = ?`).get(id) as DocumentRow | undefined;
  }

  documentByName(name: string): DocumentRow | undefined {
    return this.db
      .prepare(`SELECT * FROM documents WHERE name = ? ORDER BY created_at DESC, rowid DESC LIMIT 1`)
      .get(name) as DocumentRow | undefined;
  }

  documents(): DocumentRow[] {
    return this.db.prepare(`SELECT * FROM documents ORDER BY created_at, rowid`).all() as DocumentRow[];
  }

  deleteDocument(id: string): boolean {
    return this.db.transaction(() => {
      this.db.prepare(`DELETE FROM passages WHERE document_id = ?`).run(id);
      return this.db.prepare(`DELETE FROM documents WHERE id = ?`).run(id).changes > 0;
    })();
  }

  /** BM25-ranked passages (best first) for an FTS5 MATCH expression. */
  search(match: string, limit: number, documentId?: string): SearchHit[] {
    const filter = documentId ? `AND document_id = ?` : "";
    const args: unknown[] = documentId ? [match, documentId, limit] : [match, limit];
    return this.db
      .prepare(
        `SELECT text, document_id, start_line, end_line, bm25(passages) AS rank FROM passages WHERE passages MATCH ? ${filter} ORDER BY rank LIMIT ?`,
      )
      .all(...args) as SearchHit[];
  }
}
