/**
 * The ledger's two stores, SQLite and PostgreSQL (a real PostgreSQL 15 started for this file): the
 * same migrations give the same tables, columns and indexes; every table group's rows read back the
 * same in both (numbers as numbers, blobs as Buffers, text compared by bytes); a transaction is all
 * or nothing; and a random programme of inserts and compare-and-set transitions, some sent at once,
 * leaves each store agreeing with a model of the lifecycle table.
 */
import { SANDBOX_STATES, type SandboxState } from "@bothy/protocol";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { MIGRATIONS } from "../src/ledger/migrations.ts";
import { all, run } from "../src/ledger/sql-step.ts";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { SandboxQueries } from "../src/ledger/sandbox-rows.ts";
import { canTransition, isIn, TransitionError } from "../src/sandboxes/lifecycle.ts";
import { insertStoreSandbox, STORES, useStores } from "./helpers/stores.ts";

const stores = useStores();

interface Column {
  table_name: string;
  column_name: string;
  type: string;
  notnull: number;
}

/**
 * The user tables' columns, as `table.column type [not null]`, with the type as SQLite spells it.
 * A primary key's column counts as NOT NULL in SQLite too: PostgreSQL's are, SQLite's admit NULL
 * unless declared otherwise (a quirk it keeps for old files); the ledger never writes a NULL key.
 */
async function columns(store: LedgerStore): Promise<string[]> {
  const rows =
    store.dialect === "sqlite"
      ? await store.transaction(() =>
          all<Column>(
            `SELECT m.name AS table_name, p.name AS column_name, p.type AS type, MAX(p."notnull", p.pk > 0) AS "notnull"
               FROM sqlite_master m JOIN pragma_table_info(m.name) p
              WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'`,
          ),
        )
      : await store.transaction(() =>
          all<Column>(
            `SELECT table_name, column_name, data_type AS type, CASE WHEN is_nullable = 'NO' THEN 1 ELSE 0 END AS "notnull"
               FROM information_schema.columns WHERE table_schema = 'public' AND table_name <> 'bothy_schema'
                AND NOT (column_name = 'rowid' AND table_name IN ('commands', 'approvals'))`,
          ),
        );
  // SQLite's declared types by their affinity (BIGINT is an INTEGER there), PostgreSQL's by the spelling they came from.
  const asSqlite: Record<string, string> = {
    integer: "INTEGER",
    bigint: "INTEGER",
    BIGINT: "INTEGER",
    text: "TEXT",
    "double precision": "REAL",
    bytea: "BLOB",
  };
  return rows
    .map((c) => `${c.table_name}.${c.column_name} ${asSqlite[c.type] ?? c.type}${c.notnull ? " not null" : ""}`)
    .sort();
}

/** The indexes the migrations name (not those of primary keys and UNIQUE constraints). */
async function indexes(store: LedgerStore): Promise<string[]> {
  const rows =
    store.dialect === "sqlite"
      ? await store.transaction(() =>
          all<{ name: string }>(
            `SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_autoindex_%'`,
          ),
        )
      : await store.transaction(() =>
          all<{ name: string }>(
            `SELECT indexname AS name FROM pg_indexes WHERE schemaname = 'public'
                AND indexname NOT IN (SELECT conname FROM pg_constraint)`,
          ),
        );
  return rows.map((r) => r.name).sort();
}

describe("the two stores' schemas", () => {
  it("are the same: every table's columns, their types and NOT NULL, and the indexes", async () => {
    const sqlite = await stores.open("sqlite");
    const postgres = await stores.open("postgres");
    const sqliteColumns = await columns(sqlite);
    expect(sqliteColumns.length).toBeGreaterThan(100);
    expect(await columns(postgres)).toEqual(sqliteColumns);
    expect(await indexes(postgres)).toEqual(await indexes(sqlite));
  });

  it("PostgreSQL: nodes that open one database at once migrate it once; a newer schema is refused", async () => {
    const url = await stores.postgres().createDatabase("migrate_together");
    const opened = await Promise.all([1, 2, 3].map(() => openStore({ databaseUrl: url, sqlitePath: "" })));
    try {
      const versions = await opened[0]?.transaction(() => all<{ version: number }>(`SELECT version FROM bothy_schema`));
      expect(versions).toEqual([{ version: MIGRATIONS.length }]);
      await opened[0]?.transaction(() => run(`UPDATE bothy_schema SET version = ?`, [MIGRATIONS.length + 1]));
      await expect(openStore({ databaseUrl: url, sqlitePath: "" })).rejects.toThrow(/newer than this bothy's/);
    } finally {
      await Promise.all(opened.map((s) => s.close()));
    }
  });

  it("a database URL that is not PostgreSQL's is refused with what to set", async () => {
    await expect(openStore({ databaseUrl: "mysql://x/y", sqlitePath: "" })).rejects.toThrow(
      /BOTHY_DATABASE_URL must be a postgres:\/\//,
    );
  });
});

describe.each(STORES)("the %s store's rows", (kind) => {
  it("sandboxes, idempotency keys, commands and usage read back alike", async () => {
    const store = await stores.open(kind);
    const id = "sbx_aaaaaaaaaaaaaaaaaaaa";
    const row = await insertStoreSandbox(store, {
      id,
      metadata: '{"team":"x"}',
      delete_on_disconnect: 1,
      tenant: "alpha",
    });
    await store.insertSandbox(
      { ...row, id: "sbx_bbbbbbbbbbbbbbbbbbbb", state: "creating" },
      { key: "k1", fingerprint: "fp" },
    );
    expect(await store.getSandbox(id)).toEqual(row);
    expect(await store.findIdempotencyKey("alpha", "k1")).toEqual({
      fingerprint: "fp",
      sandbox_id: "sbx_bbbbbbbbbbbbbbbbbbbb",
    });
    expect(await store.countByState()).toEqual({ running: 1, creating: 1 });
    expect(await store.countByStateAndDriver()).toContainEqual({ state: "running", driver: "fake", n: 1 });
    await store.forgetIdempotencyKeysOf("sbx_bbbbbbbbbbbbbbbbbbbb");
    expect(await store.findIdempotencyKey("alpha", "k1")).toBeUndefined();

    // Two commands of one millisecond keep their insertion order (SQLite's rowid, PostgreSQL's column of it).
    for (const c of ["cmd_zzzzzzzzzzzzzzzzzzzz", "cmd_aaaaaaaaaaaaaaaaaaaa", "cmd_mmmmmmmmmmmmmmmmmmmm"])
      await store.insertCommand({ id: c, sandbox_id: id, cmd: c, background: c.startsWith("cmd_m") });
    const finished = await store.finishCommand("cmd_aaaaaaaaaaaaaaaaaaaa", {
      state: "exited",
      exit_code: 3,
      signal: null,
    });
    expect(finished).toMatchObject({ id: "cmd_aaaaaaaaaaaaaaaaaaaa", state: "exited", exit_code: 3, timed_out: 0 });
    expect(finished).not.toHaveProperty("rowid");
    expect(await store.finishCommand("cmd_nonexistent", { state: "lost", exit_code: null, signal: null })).toBe(
      undefined,
    );
    await store.loseCommands(id);
    const listed = await store.listCommands(id);
    expect(listed.map((c) => [c.id, c.state, c.background])).toEqual([
      ["cmd_zzzzzzzzzzzzzzzzzzzz", "lost", 0],
      ["cmd_aaaaaaaaaaaaaaaaaaaa", "exited", 0],
      ["cmd_mmmmmmmmmmmmmmmmmmmm", "lost", 1],
    ]);
    expect(listed.map((c) => Object.keys(c).sort())).toEqual(
      listed.map(() => Object.keys(listed[0] ?? {}).sort()).map((k) => k.filter((n) => n !== "rowid")),
    );

    const entry = {
      sandboxId: id,
      owner: "alpha",
      month: "2026-12",
      day: "2026-12-03",
      vcpuSeconds: 1.5,
      gibSeconds: 0.25,
    };
    await store.addUsage([entry]);
    await store.addUsage([entry]);
    expect(await store.sandboxUsage(id)).toEqual({ vcpu_seconds: 3, gib_seconds: 0.5 });
    // Per live sandbox, by tenant in one query: alpha's running one; another tenant's sees none.
    const perSandbox = [{ sandbox_id: id, vcpu_seconds: 3, gib_seconds: 0.5 }];
    expect(await store.liveSandboxUsage("alpha")).toEqual(perSandbox);
    expect(await store.liveSandboxUsage(undefined)).toEqual(perSandbox);
    expect(await store.liveSandboxUsage("beta")).toEqual([]);
    expect(await store.markWarned("alpha", "2026-12", "vcpu")).toBe(true);
    expect(await store.markWarned("alpha", "2026-12", "vcpu")).toBe(false);
    expect(await store.markWarned("alpha", "2026-12", "gib")).toBe(true);
    expect(await store.ownerUsage("2026-12")).toEqual([
      { owner: "alpha", month: "2026-12", vcpu_seconds: 3, gib_seconds: 0.5, warned: "vcpu,gib" },
    ]);
    await store.addUsage([{ ...entry, day: "2026-12-04" }]);
    expect(await store.dayUsage("2026-12-03")).toEqual([
      { owner: "alpha", day: "2026-12-03", vcpu_seconds: 3, gib_seconds: 0.5 },
      { owner: "alpha", day: "2026-12-04", vcpu_seconds: 1.5, gib_seconds: 0.25 },
    ]);
    expect(await store.dayUsage("2026-12-04")).toHaveLength(1);
  });

  it("tenants, keys, secrets, sessions, approvals, E2B rows, volumes and snapshots read back alike", async () => {
    const store = await stores.open(kind);
    const t = "2026-12-03T10:00:00.000Z";
    expect(await store.auth.insertTenant("alpha", "{}")).toBe(true);
    expect(await store.auth.insertTenant("alpha", "{}")).toBe(false);
    expect((await store.auth.tenants()).map((r) => r.id).sort()).toEqual(["alpha", "default"]);
    await store.auth.insertKey({
      id: "key_1",
      tenant: "alpha",
      name: "ci",
      digest: "d1",
      prefix: "bthy_",
      last4: "abcd",
      scopes: "sandboxes",
      created_at: t,
      expires_at: null,
    });
    expect(await store.auth.keyByDigest("d1")).toMatchObject({ id: "key_1", revoked_at: null });
    expect(await store.auth.countKeys()).toBe(1);
    expect(await store.auth.revokeKey("key_1")).toBe(true);
    expect(await store.auth.revokeKey("key_1")).toBe(false);
    await store.auth.touchKey("key_1", t);
    expect((await store.auth.key("key_1"))?.last_used_at).toBe(t);
    await insertStoreSandbox(store, { id: "sbx_aaaaaaaaaaaaaaaaaaaa", tenant: "alpha", vcpu: 2, memory_mib: 512 });
    expect(await store.auth.liveUsage("alpha")).toEqual({ sandboxes: 1, vcpu: 2, memory_mib: 512 });
    expect(await store.auth.createsSince("alpha", "2000-01-01T00:00:00.000Z")).toBe(1);
    expect(await store.auth.sandboxTenant("sbx_aaaaaaaaaaaaaaaaaaaa")).toBe("alpha");

    const sealed = Buffer.from([0, 1, 2, 255]);
    expect(await store.secrets.put({ tenant: "alpha", name: "TOKEN", sealed, hosts: "[]", inject: null })).toBe(true);
    expect(await store.secrets.put({ tenant: "alpha", name: "TOKEN", sealed, hosts: '["a"]', inject: null })).toBe(
      false,
    );
    const secret = await store.secrets.get("alpha", "TOKEN");
    expect(Buffer.isBuffer(secret?.sealed) && secret.sealed.equals(sealed)).toBe(true);
    expect(await store.secrets.missing("alpha", ["TOKEN", "OTHER"])).toEqual(["OTHER"]);
    await store.secrets.bind([{ sandbox_id: "sbx_aaaaaaaaaaaaaaaaaaaa", name: "TOKEN", env: "T", placeholder: "p1" }]);
    expect(await store.secrets.bindings("sbx_aaaaaaaaaaaaaaaaaaaa")).toEqual([
      {
        sandbox_id: "sbx_aaaaaaaaaaaaaaaaaaaa",
        name: "TOKEN",
        env: "T",
        placeholder: "p1",
        tenant: "alpha",
        hosts: '["a"]',
        inject: null,
      },
    ]);

    await store.e2b.putEnv("sbx_aaaaaaaaaaaaaaaaaaaa", Buffer.from("one"));
    await store.e2b.putEnv("sbx_aaaaaaaaaaaaaaaaaaaa", Buffer.from("two"));
    expect((await store.e2b.env("sbx_aaaaaaaaaaaaaaaaaaaa"))?.toString()).toBe("two");
    const proc = {
      sandbox_id: "sbx_aaaaaaaaaaaaaaaaaaaa",
      pid: 7,
      command_id: "c",
      config: "{}",
      pty: 0,
      tag: null,
      signalled: null,
    };
    await store.e2b.putProcess(proc);
    await store.e2b.putProcess({ ...proc, tag: "t" });
    await store.e2b.setSignalled("sbx_aaaaaaaaaaaaaaaaaaaa", 7, "SIGTERM");
    expect(await store.e2b.processes("sbx_aaaaaaaaaaaaaaaaaaaa")).toEqual([
      { ...proc, tag: "t", signalled: "SIGTERM" },
    ]);

    const approval = {
      id: "apr_1",
      tenant: "alpha",
      sandbox_id: "sbx_aaaaaaaaaaaaaaaaaaaa",
      conversation_id: null,
      kind: "http" as const,
      method: "GET",
      host: "example.test",
      path: "/",
      tool: null,
      excerpt: "GET /",
      rule: "ask",
      created_at: t,
      expires_at: "2999-01-01T00:00:00.000Z",
    };
    await store.approvals.insert(approval);
    await store.approvals.insert({ ...approval, id: "apr_2" });
    const how = {
      state: "approved" as const,
      decidedBy: "key_1",
      grantKind: "host" as const,
      grantUntil: "2999-01-01T00:00:00.000Z",
      reason: null,
    };
    expect(await store.approvals.settle("apr_1", how, t)).toMatchObject({ id: "apr_1", state: "approved" });
    expect(await store.approvals.settle("apr_1", how, t)).toBeUndefined();
    expect(await store.approvals.hostGranted("sbx_aaaaaaaaaaaaaaaaaaaa", "example.test", t)).toBe(true);
    // Of one created_at, the later insert lists first (newest first, by insertion).
    expect((await store.approvals.list({ limit: 10 })).map((a) => a.id)).toEqual(["apr_2", "apr_1"]);
    expect((await store.approvals.cancelAllPending("restart", t)).map((a) => a.id)).toEqual(["apr_2"]);

    await store.sessions.insert({
      digest: "s1",
      key_id: "key_1",
      created_at: t,
      expires_at: "2999-01-01T00:00:00.000Z",
    });
    expect(await store.sessions.get("s1")).toMatchObject({ key_id: "key_1" });
    expect(await store.sessions.prune(t)).toBe(1); // its key is revoked

    await store.volumes.insert({ id: "vol_1", tenant: "alpha", name: "data", size_mib: 64, created_at: t });
    await store.volumes.addClaims([
      { sandbox_id: "sbx_aaaaaaaaaaaaaaaaaaaa", volume_id: "vol_1", path: "/data", read_only: 0 },
    ]);
    expect(await store.volumes.totalMib("alpha")).toBe(64);
    expect(await store.volumes.remove("vol_1")).toHaveLength(1);

    const snapshot = {
      id: "snp_1",
      tenant: "alpha",
      name: "base",
      source_sandbox_id: "sbx_aaaaaaaaaaaaaaaaaaaa",
      template: "seed",
      template_hash: "h",
      driver: "gvisor",
      layer_id: "l1",
      template_layer: "t1",
      bytes: 5_000_000_000, // past 2^32: a BIGINT, read back as a number
      created_at: t,
      idempotency_key: null,
      memory: 1,
    };
    await store.snapshots.insert(snapshot);
    await store.snapshots.addUse("sbx_aaaaaaaaaaaaaaaaaaaa", "snp_1");
    expect(await store.snapshots.byId("snp_1")).toEqual(snapshot);
    expect(await store.snapshots.totalBytes("alpha")).toBe(5_000_000_000);
    expect(await store.snapshots.remove("snp_1")).toEqual(["sbx_aaaaaaaaaaaaaaaaaaaa"]);

    await store.transition("sbx_aaaaaaaaaaaaaaaaaaaa", "running", "failed");
    expect(await store.volumes.remove("vol_1")).toEqual([]);
    expect(await store.volumes.allIds()).toEqual(new Set());
    expect(await store.snapshots.remove("snp_1")).toEqual([]);
  });

  it("text sorts and compares by bytes, as ISO times and ids need", async () => {
    const store = await stores.open(kind);
    await store.auth.insertTenant("alpha", "{}");
    for (const name of ["b", "B", "a-c", "ab", "a_b"])
      await store.secrets.put({ tenant: "alpha", name, sealed: Buffer.from("x"), hosts: "[]", inject: null });
    expect((await store.secrets.list("alpha")).map((r) => r.name)).toEqual(["B", "a-c", "a_b", "ab", "b"]);
  });

  it("a transaction is all or nothing", async () => {
    const store = await stores.open(kind);
    const rows = new SandboxQueries();
    await expect(
      store.transaction(function* () {
        yield* rows.insertSandbox({
          id: "sbx_tttttttttttttttttttt",
          template: "seed",
          template_hash: "h",
          driver: "fake",
          acceleration: null,
          vcpu: 1,
          memory_mib: 256,
          state: "running",
        });
        yield* rows.transition("sbx_tttttttttttttttttttt", "creating", "running");
      }),
    ).rejects.toBeInstanceOf(TransitionError);
    expect(await store.getSandbox("sbx_tttttttttttttttttttt")).toBeUndefined();
  });
});

type Step =
  | { t: "insert"; i: number; running: boolean }
  | { t: "move"; i: number; from: SandboxState; to: SandboxState }
  | {
      t: "together";
      a: { i: number; from: SandboxState; to: SandboxState };
      b: { i: number; from: SandboxState; to: SandboxState };
    };

const state = fc.constantFrom(...SANDBOX_STATES);
const move = fc.record({ i: fc.nat(3), from: state, to: state });
const programme = fc.array(
  fc.oneof(
    { weight: 2, arbitrary: fc.record({ t: fc.constant("insert" as const), i: fc.nat(3), running: fc.boolean() }) },
    { weight: 6, arbitrary: move.map((m) => ({ t: "move" as const, ...m })) },
    { weight: 2, arbitrary: fc.record({ t: fc.constant("together" as const), a: move, b: move }) },
  ) as fc.Arbitrary<Step>,
  { maxLength: 25 },
);

type Outcome = "ok" | "illegal" | "stale";

/** The lifecycle table's answer to one move on the model, and the model after it. */
function modelMove(model: Map<number, SandboxState>, m: { i: number; from: SandboxState; to: SandboxState }): Outcome {
  if (!canTransition(m.from, m.to)) return "illegal";
  if (model.get(m.i) !== m.from) return "stale";
  model.set(m.i, m.to);
  return "ok";
}

async function storeMove(
  store: LedgerStore,
  id: string,
  m: { from: SandboxState; to: SandboxState },
): Promise<Outcome> {
  try {
    await store.transition(id, m.from, m.to);
    return "ok";
  } catch (err) {
    if (err instanceof TransitionError) return err.kind;
    throw err;
  }
}

describe.each(STORES)("a random programme of transitions on the %s store", (kind) => {
  it("leaves the store agreeing with the lifecycle table's model after every step", async () => {
    const store = await stores.open(kind);
    let runNo = 0;
    await fc.assert(
      fc.asyncProperty(programme, async (steps) => {
        const prefix = `sbx_${String(runNo++).padStart(4, "0")}`;
        const id = (i: number): string => `${prefix}${String(i).padStart(16, "0")}`;
        const model = new Map<number, SandboxState>();
        for (const step of steps) {
          if (step.t === "insert") {
            if (model.has(step.i)) continue;
            await insertStoreSandbox(store, { id: id(step.i), state: step.running ? "running" : "creating" });
            model.set(step.i, step.running ? "running" : "creating");
          } else if (step.t === "move") {
            expect(await storeMove(store, id(step.i), step)).toBe(modelMove(model, step));
          } else {
            // Sent at once: the store must agree with one of the two orders.
            const [a, b] = await Promise.all([
              storeMove(store, id(step.a.i), step.a),
              storeMove(store, id(step.b.i), step.b),
            ]);
            const ab = new Map(model);
            const ba = new Map(model);
            const abOut = [modelMove(ab, step.a), modelMove(ab, step.b)];
            const baOut = [modelMove(ba, step.b), modelMove(ba, step.a)].reverse();
            const actual = [a, b];
            const matches = (out: Outcome[]): boolean => out[0] === actual[0] && out[1] === actual[1];
            expect(matches(abOut) || matches(baOut)).toBe(true);
            const chosen = matches(abOut) ? ab : ba;
            model.clear();
            for (const [k, v] of chosen) model.set(k, v);
          }
          for (const [i, s] of model) {
            const row = await store.getSandbox(id(i));
            expect(row?.state).toBe(s);
            expect(row?.deleted_at !== null).toBe(s === "deleted");
          }
        }
        const live = (await store.liveSandboxes()).map((r) => r.id).filter((r) => r.startsWith(prefix));
        const expected = [...model].filter(([, s]) => isIn("live", s)).map(([i]) => id(i));
        expect(live.sort()).toEqual(expected.sort());
      }),
      { numRuns: 40 },
    );
  }, 120_000);
});

describe("opening a PostgreSQL store that is not there", () => {
  it("fails with what to check, never showing the URL's password", async () => {
    // Port 1 on loopback: nothing listens there.
    const err = await openStore({ databaseUrl: "postgres://bothy:s3cret-pw@127.0.0.1:1/bothy", sqlitePath: "" }).catch(
      (e: unknown) => e as Error,
    );
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).message).toContain("could not be opened");
    expect((err as Error).message).toContain("unset BOTHY_DATABASE_URL");
    expect((err as Error).message).toContain("postgres://bothy:***@127.0.0.1:1/bothy");
    expect((err as Error).message).not.toContain("s3cret-pw");
  });

  it("refuses a URL that is not postgres://", async () => {
    await expect(openStore({ databaseUrl: "mysql://root:pw@127.0.0.1/x", sqlitePath: "" })).rejects.toThrow(
      /must be a postgres:\/\/ or postgresql:\/\/ URL/,
    );
  });
});
