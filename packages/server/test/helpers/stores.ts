import { TEST_SANDBOX_ROW } from "./ledger-rows.ts";
import { afterAll, beforeAll } from "vitest";
import type { DialectName } from "../../src/ledger/dialect.ts";
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
export function insertStoreSandbox(
  store: LedgerStore,
  row: Partial<Parameters<LedgerStore["insertSandbox"]>[0]> & { id: string },
): ReturnType<LedgerStore["insertSandbox"]> {
  return store.insertSandbox({ ...TEST_SANDBOX_ROW, ...row });
}
