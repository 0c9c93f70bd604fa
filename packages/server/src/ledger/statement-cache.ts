import type Database from "better-sqlite3";

/**
 * Statements compiled once and kept, by their SQL: every command reads its sandbox's row and
 * writes its own record and events several times, and a replay reads page after page, so
 * compiling the SQL each time was a measurable part of a short command's round trip.
 */
export class StatementCache {
  private readonly statements = new Map<string, Database.Statement>();

  constructor(private readonly db: Database.Database) {}

  get(sql: string): Database.Statement {
    let statement = this.statements.get(sql);
    if (!statement) {
      statement = this.db.prepare(sql);
      this.statements.set(sql, statement);
    }
    return statement;
  }
}
