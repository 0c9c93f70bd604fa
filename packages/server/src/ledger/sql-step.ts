/**
 * The ledger's rows are written once, as generator functions that yield the SQL they need and get
 * its result back (`yield* get(...)`), and run by either store: the SQLite runner answers each step
 * at once, synchronously, inside the store's asynchronous call; the PostgreSQL runner awaits each
 * on its pool. So both stores share one copy of every query and of
 * the logic around it (Babel's `gensync` runs one function sync or async the same way).
 *
 * SQL is written in the SQLite spelling with `?` placeholders; `dialect.ts` turns it into each
 * store's own.
 */

/** A value a query may bind: what both drivers accept and return. */
export type SqlValue = string | number | bigint | Buffer | null;
export type SqlParams = readonly SqlValue[];

export type Op =
  | { readonly kind: "all" | "get" | "run"; readonly sql: string; readonly params: SqlParams }
  | { readonly kind: "transaction" | "relaxed"; readonly body: () => Step<unknown> }
  | { readonly kind: "serialize"; readonly key: number }
  | { readonly kind: "notify"; readonly channel: string; readonly payload: string };

/** A piece of ledger work: yields operations, is resumed with their results, returns `T`. */
export type Step<T> = Generator<Op, T, unknown>;

/** Every row the query returns. */
export function* all<R>(sql: string, params: SqlParams = []): Step<R[]> {
  return (yield { kind: "all", sql, params }) as R[];
}

/** The first row the query returns, or undefined. */
export function* get<R>(sql: string, params: SqlParams = []): Step<R | undefined> {
  return (yield { kind: "get", sql, params }) as R | undefined;
}

/** Runs a write; answers how many rows it changed. */
export function* run(sql: string, params: SqlParams = []): Step<number> {
  return (yield { kind: "run", sql, params }) as number;
}

/**
 * Runs `body` as one transaction: all of it or none. Inside one, a read that the body writes back
 * after says `FOR UPDATE` (PostgreSQL locks the row; SQLite, whose writes one process serializes,
 * drops the words).
 */
export function* transaction<T>(body: () => Step<T>): Step<T> {
  return (yield { kind: "transaction", body }) as T;
}

/**
 * Runs `body` committed without waiting for the disk, where the store can (SQLite's
 * synchronous=NORMAL): for rows written several times per command, whose loss in a power cut
 * costs little (see `openSqlite`).
 */
export function* relaxed<T>(body: () => Step<T>): Step<T> {
  return (yield { kind: "relaxed", body }) as T;
}

/**
 * Inside a transaction: waits until no other transaction holds `key`, and holds it until this one
 * ends (PostgreSQL's `pg_advisory_xact_lock`), so transactions that take it commit one after
 * another in the order they took it. SQLite's one writer serializes them already: nothing to do.
 */
export function* serialize(key: number): Step<void> {
  yield { kind: "serialize", key };
}

/**
 * Tells the other processes on the database that something changed (PostgreSQL's `pg_notify`,
 * delivered when the transaction commits, or at once outside one). A wake-up only: a listener reads
 * the rows, never trusts the payload as data. SQLite has one process: nothing to tell.
 */
export function* notify(channel: string, payload = ""): Step<void> {
  yield { kind: "notify", channel, payload };
}

type StepMethodKeys<T> = {
  [K in keyof T]: T[K] extends (...args: never[]) => Step<unknown> ? K : never;
}[keyof T];

/** A rows class as asynchronous callers see it: each step method returns a Promise of its result. */
export type Asynced<T> = {
  [K in StepMethodKeys<T>]: T[K] extends (...args: infer A) => Step<infer R> ? (...args: A) => Promise<R> : never;
};

/**
 * An object with each generator method of `rows` (the class's own prototype) run by `runner`
 * (`Asynced<T>` for the stores' runners).
 */
export function bindSteps<V>(rows: object, runner: (step: Step<unknown>) => unknown): V {
  const view: Record<string, (...args: unknown[]) => unknown> = {};
  const proto = Object.getPrototypeOf(rows) as Record<string, unknown>;
  for (const name of Object.getOwnPropertyNames(proto)) {
    const method = proto[name];
    if (name === "constructor" || typeof method !== "function") continue;
    view[name] = (...args: unknown[]) => runner((method as (...a: unknown[]) => Step<unknown>).apply(rows, args));
  }
  return view as V;
}
