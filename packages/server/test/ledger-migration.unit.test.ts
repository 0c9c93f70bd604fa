/**
 * A ledger made before tenants (schema 9, today's release) migrates with nothing lost: every
 * sandbox, command, event, idempotency key and usage row belongs to the `default` tenant after.
 * On both stores: a SQLite file, and a PostgreSQL database brought to schema 9 the same way.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import pg from "pg";
import { afterEach, describe, expect, it } from "vitest";
import { translateMigration, translateQuery } from "../src/ledger/dialect.ts";
import { DEFAULT_TENANT, MIGRATIONS } from "../src/ledger/ledger.ts";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { STORES, useStores } from "./helpers/stores.ts";

const BEFORE_TENANTS = 9;
const stores = useStores();
let dir: string | undefined;

afterEach(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
  dir = undefined;
});

/** One of each kind of row, as the release before tenants wrote them. */
async function oldRows(exec: (sql: string, params?: unknown[]) => Promise<void>): Promise<void> {
  const t = "2026-11-30T10:00:00.000Z";
  await exec(
    `INSERT INTO sandboxes (id, template, template_hash, driver, vcpu, memory_mib, state, created_at, updated_at, metadata, disk_mib, max_processes)
     VALUES ('sbx_aaaaaaaaaaaaaaaaaaaa', 'seed', 'h', 'gvisor', 1, 512, 'running', ?, ?, '{"team":"x"}', 4096, 1024)`,
    [t, t],
  );
  await exec(
    `INSERT INTO sandboxes (id, template, template_hash, driver, vcpu, memory_mib, state, created_at, updated_at, deleted_at)
     VALUES ('sbx_bbbbbbbbbbbbbbbbbbbb', 'seed', 'h', 'gvisor', 1, 512, 'deleted', ?, ?, ?)`,
    [t, t, t],
  );
  await exec(
    `INSERT INTO commands (id, sandbox_id, cmd, state, exit_code, started_at, ended_at) VALUES ('cmd_aaaaaaaaaaaaaaaaaaaa', 'sbx_aaaaaaaaaaaaaaaaaaaa', 'echo', 'exited', 0, ?, ?)`,
    [t, t],
  );
  await exec(
    `INSERT INTO idempotency_keys (key, fingerprint, sandbox_id, created_at) VALUES ('k1', 'fp', 'sbx_aaaaaaaaaaaaaaaaaaaa', ?)`,
    [t],
  );
  await exec(
    `INSERT INTO events (type, sandbox_id, data, created_at) VALUES ('sandbox.created', 'sbx_aaaaaaaaaaaaaaaaaaaa', '{}', ?)`,
    [t],
  );
  await exec(
    `INSERT INTO usage_sandbox (sandbox_id, owner, vcpu_seconds, gib_seconds) VALUES ('sbx_aaaaaaaaaaaaaaaaaaaa', 'default', 3600, 1800)`,
  );
  await exec(
    `INSERT INTO usage_owner (owner, month, vcpu_seconds, gib_seconds) VALUES ('default', '2026-11', 3600, 1800)`,
  );
}

/** A SQLite ledger file at schema 9 with the old rows; the store that opens it. */
async function oldSqlite(): Promise<{ store: LedgerStore; path: string }> {
  dir = await mkdtemp(join(tmpdir(), "bothy-ledger-"));
  const path = join(dir, "ledger.sqlite");
  const db = new Database(path);
  for (const step of MIGRATIONS.slice(0, BEFORE_TENANTS)) db.exec(step);
  db.pragma(`user_version = ${BEFORE_TENANTS}`);
  await oldRows(async (sql, params = []) => void db.prepare(sql).run(...params));
  db.close();
  return { store: await openStore({ sqlitePath: path }), path };
}

/** A PostgreSQL database at schema 9 (as pg-runner.ts's migrate leaves one) with the old rows. */
async function oldPostgres(): Promise<{ store: LedgerStore; path: string }> {
  const url = await stores.postgres().createDatabase("before_tenants");
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await client.query(`CREATE TABLE bothy_schema (version INTEGER NOT NULL)`);
    await client.query(`INSERT INTO bothy_schema (version) VALUES (${BEFORE_TENANTS})`);
    for (const step of MIGRATIONS.slice(0, BEFORE_TENANTS)) await client.query(translateMigration(step, "postgres"));
    await oldRows(async (sql, params = []) => void (await client.query(translateQuery(sql, "postgres"), params)));
  } finally {
    await client.end();
  }
  return { store: await openStore({ databaseUrl: url, sqlitePath: "" }), path: url };
}

describe.each(STORES)("ledger migration to tenants on %s", (kind) => {
  it("moves every row of a ledger made before tenants to the default tenant", async () => {
    const { store: ledger, path } = kind === "sqlite" ? await oldSqlite() : await oldPostgres();
    try {
      const rows = await ledger.listSandboxes({ includeDeleted: true });
      expect(rows.map((r) => [r.id, r.tenant, r.state])).toEqual([
        ["sbx_aaaaaaaaaaaaaaaaaaaa", DEFAULT_TENANT, "running"],
        ["sbx_bbbbbbbbbbbbbbbbbbbb", DEFAULT_TENANT, "deleted"],
      ]);
      expect(rows[0]?.metadata).toBe('{"team":"x"}');
      expect(await ledger.getCommand("cmd_aaaaaaaaaaaaaaaaaaaa")).toMatchObject({ exit_code: 0 });
      expect(await ledger.findIdempotencyKey(DEFAULT_TENANT, "k1")).toEqual({
        fingerprint: "fp",
        sandbox_id: "sbx_aaaaaaaaaaaaaaaaaaaa",
      });
      expect(await ledger.findIdempotencyKey("other", "k1")).toBeUndefined();
      expect((await ledger.eventsSince(0)).map((e) => [e.type, e.tenant])).toEqual([
        ["sandbox.created", DEFAULT_TENANT],
      ]);
      expect(await ledger.ownerUsage("2026-11")).toMatchObject([{ owner: DEFAULT_TENANT, vcpu_seconds: 3600 }]);
      const tenants = await ledger.auth.tenants();
      expect(tenants.map((t) => t.id)).toEqual([DEFAULT_TENANT]);
      expect(tenants[0]?.created_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      expect(await ledger.auth.countKeys()).toBe(0);
      expect((await ledger.auth.sandboxIdsOf(DEFAULT_TENANT)).size).toBe(2);
      // New rows take their sandbox's tenant.
      await ledger.insertCommand({ id: "cmd_bbbbbbbbbbbbbbbbbbbb", sandbox_id: "sbx_aaaaaaaaaaaaaaaaaaaa", cmd: "ls" });
      expect((await ledger.insertEvent("command.exited", "sbx_aaaaaaaaaaaaaaaaaaaa", {})).tenant).toBe(DEFAULT_TENANT);
      expect((await ledger.insertEvent("budget.exceeded", null, {})).tenant).toBeNull();
    } finally {
      await ledger.close();
    }
    // Opening it again runs nothing twice.
    if (kind === "sqlite") await (await openStore({ sqlitePath: path })).close();
    else await (await openStore({ databaseUrl: path, sqlitePath: "" })).close();
  });
});
