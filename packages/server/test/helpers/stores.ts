import { insertTestSandbox } from "./ledger-rows.ts";
import { afterAll, beforeAll } from "vitest";
import type { DialectName } from "../../src/ledger/dialect.ts";
import { all, run } from "../../src/ledger/sql-step.ts";
import { openStore, type LedgerStore } from "../../src/ledger/store.ts";
import { startPostgres, type TestPostgres } from "./postgres.ts";

/** Both stores, for `describe.each(STORES)`. */
export const STORES: readonly DialectName[] = ["sqlite", "postgres"];

/**
 * Fresh, empty ledgers of either store for one test file: PostgreSQL is started once for the file
 * (a database per store opened, so tests do not see each other's rows), SQLite is in memory. Every
 * store opened is closed, and the server stopped, after the file's tests.
 */
export function useStores(): { open(kind: DialectName): Promise<LedgerStore>; postgres(): TestPostgres } {
  let server: TestPostgres | undefined;
  const opened: LedgerStore[] = [];
  let n = 0;
  beforeAll(async () => {
    server = await startPostgres();
  }, 120_000);
  afterAll(async () => {
    await Promise.all(opened.map((s) => s.close().catch(() => undefined)));
    await server?.stop();
  }, 60_000);
  return {
    async open(kind) {
      let store: LedgerStore;
      if (kind === "sqlite") store = await openStore({ sqlitePath: ":memory:" });
      else {
        if (!server) throw new Error("postgres is not running (useStores' beforeAll failed)");
        store = await openStore({ databaseUrl: await server.createDatabase(`ledger_${++n}`), sqlitePath: "" });
      }
      opened.push(store);
      return store;
    },
    postgres() {
      if (!server) throw new Error("postgres is not running");
      return server;
    },
  };
}

/** A running seed sandbox's row (fake driver, 1 vCPU, 256 MiB) in `store`, `row` on top. */
export const insertStoreSandbox = insertTestSandbox;

/**
 * Empties a store's tables but `tenants` (whose `default` row the migrations make), as a fresh
 * store would be: for tests that reuse one PostgreSQL database run after run.
 */
export async function emptyStore(store: LedgerStore): Promise<void> {
  const listed =
    store.dialect === "sqlite"
      ? `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`
      : `SELECT table_name AS name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'`;
  const dialect = store.dialect;
  await store.transaction(function* () {
    const names = (yield* all<{ name: string }>(listed))
      .map((t) => t.name)
      .filter((n) => n !== "tenants" && n !== "bothy_schema");
    if (dialect === "postgres") yield* run(`TRUNCATE ${names.join(", ")} RESTART IDENTITY CASCADE`);
    else for (const name of names) yield* run(`DELETE FROM ${name}`);
  });
}
