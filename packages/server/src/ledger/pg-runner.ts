import pg from "pg";
import { translateMigration, translateQuery } from "./dialect.ts";
import { MIGRATIONS } from "./migrations.ts";
import type { Op, Step } from "./sql-step.ts";

/** Most distinct statements whose PostgreSQL text is kept (see sqlite-runner.ts's bound). */
const MAX_STATEMENTS = 500;

/** Any 64-bit key of bothy's own: the lock that lets one node at a time migrate a shared database. */
const MIGRATION_LOCK = 0x626f746879; // "bothy"

/**
 * int8 (COUNT, SUM of integers, the events' identity) and numeric as JS numbers, as SQLite gives
 * them; the values the ledger keeps are far below 2^53. Set per pool, not on pg's global table.
 */
const INT8 = 20;
const NUMERIC = 1700;
const types: pg.CustomTypesConfig = {
  getTypeParser: ((oid: number, format?: "text" | "binary") =>
    oid === INT8 || oid === NUMERIC
      ? (value: string) => Number(value)
      : pg.types.getTypeParser(oid, format)) as pg.CustomTypesConfig["getTypeParser"],
};

/** A connection that queries: the pool, or one client inside a transaction. */
type Queryable = Pick<pg.Pool, "query"> | pg.PoolClient;

/**
 * Runs ledger steps on a PostgreSQL pool. Each step's SQL is translated once (dialect.ts); a
 * transaction takes one client from the pool for its whole body (`BEGIN` … `COMMIT`, `ROLLBACK` on
 * any error), and a transaction inside one runs in it.
 */
export class PgRunner {
  /** Each statement's PostgreSQL text and its name: a named statement is parsed once per connection. */
  private readonly statements = new Map<string, { name: string | undefined; text: string }>();

  constructor(private readonly pool: pg.Pool) {}

  static pool(url: string, max = 10): pg.Pool {
    const pool = new pg.Pool({ connectionString: url, max, types });
    // An idle client whose server went away emits this; the next query reconnects (or fails there).
    pool.on("error", () => undefined);
    return pool;
  }

  private statement(sql: string): { name: string | undefined; text: string } {
    let statement = this.statements.get(sql);
    if (statement === undefined) {
      const text = translateQuery(sql, "postgres");
      if (this.statements.size < MAX_STATEMENTS) {
        statement = { name: `bothy_${this.statements.size}`, text };
        this.statements.set(sql, statement);
      } else statement = { name: undefined, text };
    }
    return statement;
  }

  /** Runs `step` to its end and resolves to its result (or rejects with what it threw). */
  async run<T>(step: Step<T>, client?: pg.PoolClient): Promise<T> {
    let next = step.next();
    while (!next.done) {
      let result: unknown;
      try {
        result = await this.op(next.value, client);
      } catch (err) {
        next = step.throw(err);
        continue;
      }
      next = step.next(result);
    }
    return next.value;
  }

  private async query(op: Op & { kind: "all" | "get" | "run" }, on: Queryable): Promise<pg.QueryResult> {
    const { name, text } = this.statement(op.sql);
    return on.query({ name, text, values: op.params as unknown[] });
  }

  private async op(op: Op, client: pg.PoolClient | undefined): Promise<unknown> {
    const on: Queryable = client ?? this.pool;
    switch (op.kind) {
      case "all":
        return (await this.query(op, on)).rows.map(withoutRowid);
      case "get": {
        const row = (await this.query(op, on)).rows[0] as Record<string, unknown> | undefined;
        return row === undefined ? undefined : withoutRowid(row);
      }
      case "run":
        return (await this.query(op, on)).rowCount ?? 0;
      case "transaction":
        return client ? this.run(op.body(), client) : this.transaction((c) => this.run(op.body(), c));
      case "serialize":
        if (!client)
          throw new Error("serialize() holds its lock until the transaction ends: call it inside transaction()");
        return void (await client.query("SELECT pg_advisory_xact_lock($1::bigint)", [op.key]));
      case "notify":
        return void (await on.query("SELECT pg_notify($1, $2)", [op.channel, op.payload]));
      case "relaxed":
        // Every commit waits for the WAL's flush here: PostgreSQL's per-transaction
        // synchronous_commit=off would cost a BEGIN and a COMMIT more per write than it saves.
        return this.run(op.body(), client);
    }
  }

  private async transaction<T>(body: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    const client = await this.pool.connect();
    let broken: unknown;
    try {
      await client.query("BEGIN");
      const result = await body(client);
      await client.query("COMMIT");
      return result;
    } catch (err) {
      await client.query("ROLLBACK").catch((rollbackErr: unknown) => {
        // A client that cannot roll back is not given to the next caller.
        broken = rollbackErr;
      });
      throw err;
    } finally {
      client.release(broken instanceof Error ? broken : undefined);
    }
  }

  /**
   * Runs the migrations the database lacks, in one transaction under an advisory lock, so nodes
   * that start together migrate it once; the table `bothy_schema` counts them (SQLite's user_version).
   */
  async migrate(): Promise<void> {
    await this.transaction(async (client) => {
      await client.query(`SELECT pg_advisory_xact_lock(${MIGRATION_LOCK})`);
      await client.query(`CREATE TABLE IF NOT EXISTS bothy_schema (version INTEGER NOT NULL)`);
      const row = (await client.query(`SELECT version FROM bothy_schema`)).rows[0] as { version: number } | undefined;
      if (row === undefined) await client.query(`INSERT INTO bothy_schema (version) VALUES (0)`);
      const version = row?.version ?? 0;
      if (version > MIGRATIONS.length)
        throw new Error(
          `The database's ledger schema is version ${version}, newer than this bothy's ${MIGRATIONS.length}: run the newer bothy, or point BOTHY_DATABASE_URL at another database.`,
        );
      for (let i = version; i < MIGRATIONS.length; i++)
        await client.query(translateMigration(MIGRATIONS[i] ?? "", "postgres"));
      if (version < MIGRATIONS.length) await client.query(`UPDATE bothy_schema SET version = $1`, [MIGRATIONS.length]);
    });
  }
}

/** PostgreSQL spells out the `rowid` SQLite keeps hidden (dialect.ts); rows read back do not show it. */
function withoutRowid(row: Record<string, unknown>): Record<string, unknown> {
  if ("rowid" in row) delete row.rowid;
  return row;
}
