import type Database from "better-sqlite3";
import { translateQuery } from "./dialect.ts";
import type { Op, SqlParams, Step } from "./sql-step.ts";

/**
 * Most distinct statements kept compiled. The ledger's SQL is fixed text, except lists whose length
 * varies (an audit's event types, an approvals filter): a few dozen in all; the bound only keeps a
 * caller that varied them without end from growing the map.
 */
const MAX_STATEMENTS = 500;

/**
 * Runs ledger steps on a better-sqlite3 database, synchronously: each step's SQL is compiled once
 * and kept by its text (every command reads its sandbox's row and writes its record and events
 * several times, and compiling each time was a measurable part of a short command's round trip).
 * The only place that prepares statements on the ledger's database.
 */
export class SqliteRunner {
  private readonly statements = new Map<string, Database.Statement>();

  constructor(private readonly db: Database.Database) {}

  private statement(sql: string): Database.Statement {
    let statement = this.statements.get(sql);
    if (!statement) {
      statement = this.db.prepare(translateQuery(sql, "sqlite"));
      if (this.statements.size < MAX_STATEMENTS) this.statements.set(sql, statement);
    }
    return statement;
  }

  /** Runs `step` to its end and returns its result (or throws what it threw). */
  run<T>(step: Step<T>): T {
    let next = step.next();
    while (!next.done) {
      let result: unknown;
      try {
        result = this.op(next.value);
      } catch (err) {
        next = step.throw(err);
        continue;
      }
      next = step.next(result);
    }
    return next.value;
  }

  private op(op: Op): unknown {
    switch (op.kind) {
      case "all":
        return this.statement(op.sql).all(...(op.params as SqlParams));
      case "get":
        return this.statement(op.sql).get(...op.params);
      case "run":
        return this.statement(op.sql).run(...op.params).changes;
      case "transaction":
        return this.db.transaction(() => this.run(op.body()))();
      case "serialize":
      case "notify":
        // One process and one writer: transactions are serialized already, and nobody else listens.
        return undefined;
      case "relaxed":
        // Inside a transaction the commit is the transaction's, durable as it is.
        if (this.db.inTransaction) return this.run(op.body());
        this.statement("PRAGMA synchronous = NORMAL").run();
        try {
          return this.run(op.body());
        } finally {
          this.statement("PRAGMA synchronous = FULL").run();
        }
    }
  }
}
