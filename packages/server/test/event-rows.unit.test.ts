/**
 * The events table as replays page it and the sweeper prunes it (real SQLite): a tenant's page
 * holds its own rows only, read through its own index range; retention by rows and by age.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { loadConfig } from "../src/config.ts";
import { parseRetention, pruneEvents } from "../src/events/event-retention.ts";
import type { ServerEvent } from "../src/events/server-events.ts";
import { EventQueries } from "../src/ledger/event-rows.ts";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { STORES, useStores } from "./helpers/stores.ts";

const stores = useStores();
const SBX_A = "sbx_aaaaaaaaaaaaaaaaaaaa";

/** Appends `n` events of `tenant` in one transaction (one round trip per row would dominate on PostgreSQL). */
async function append(ledger: LedgerStore, n: number, tenant: string): Promise<void> {
  const events = new EventQueries();
  await ledger.transaction(function* () {
    for (let i = 0; i < n; i++) yield* events.insertEvent("sandbox.created", null, { i }, tenant);
  });
}

describe.each(STORES)("event pages in the %s ledger", (kind) => {
  let ledger: LedgerStore;
  beforeEach(async () => {
    ledger = await stores.open(kind);
  });

  it("hold the tenant's own rows, oldest first, at most the limit; an admin's hold every row", async () => {
    for (let i = 0; i < 30; i++) {
      await ledger.insertEvent("sandbox.created", null, { i }, "beta");
      if (i % 3 === 0) await ledger.insertEvent("sandbox.created", null, { i }, "alpha");
    }
    await ledger.insertEvent("budget.exceeded", null, {}); // host-wide
    const alpha = await ledger.events.page(0, { tenant: "alpha" }, 4);
    expect(alpha.map((r) => [r.tenant, JSON.parse(r.data).i])).toEqual([
      ["alpha", 0],
      ["alpha", 3],
      ["alpha", 6],
      ["alpha", 9],
    ]);
    const rest = await ledger.events.page(alpha.at(-1)?.seq ?? 0, { tenant: "alpha" }, 100);
    expect(rest.map((r) => JSON.parse(r.data).i)).toEqual([12, 15, 18, 21, 24, 27]);
    expect(await ledger.events.page(0, { tenant: null }, 1000)).toHaveLength(41);
    expect((await ledger.events.page(0, { tenant: null }, 1000)).at(-1)?.tenant).toBeNull();
  });

  it("of one sandbox hold that sandbox's rows", async () => {
    await ledger.insertEvent("sandbox.created", SBX_A, {}, "alpha");
    await ledger.insertEvent("sandbox.created", "sbx_bbbbbbbbbbbbbbbbbbbb", {}, "alpha");
    expect((await ledger.events.page(0, { tenant: "alpha", sandboxId: SBX_A }, 10)).map((r) => r.sandbox_id)).toEqual([
      SBX_A,
    ]);
    expect(await ledger.events.page(0, { tenant: "beta", sandboxId: SBX_A }, 10)).toEqual([]);
  });
});

describe("event pages in the sqlite ledger's plan", () => {
  let dir: string;
  let ledger: LedgerStore;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "bothy-event-rows-"));
    ledger = await openStore({ sqlitePath: join(dir, "ledger.sqlite") });
  });
  afterEach(async () => {
    await ledger.close();
    await rm(dir, { recursive: true, force: true });
  });

  it("of a tenant are one range of its own index, not a scan of every row", () => {
    // The plan SQLite chose for the statement the page runs.
    const db = new Database(join(dir, "ledger.sqlite"));
    try {
      const plan = db
        .prepare(
          `EXPLAIN QUERY PLAN SELECT * FROM events INDEXED BY events_tenant WHERE tenant = ? AND seq > ? ORDER BY seq LIMIT ?`,
        )
        .all("alpha", 0, 10) as Array<{ detail: string }>;
      expect(plan.map((p) => p.detail).join(" | ")).toMatch(
        /SEARCH events USING INDEX events_tenant \(tenant=\? AND seq>\?\)/,
      );
    } finally {
      db.close();
    }
  });
});

describe.each(STORES)("event retention in the %s ledger", (kind) => {
  let ledger: LedgerStore;
  beforeEach(async () => {
    ledger = await stores.open(kind);
  });
  const logged: ServerEvent[] = [];
  const log = ((event: ServerEvent["event"], fields: object) =>
    logged.push({ event, ...fields } as ServerEvent)) as Parameters<typeof pruneEvents>[2];

  it("keeps the newest rows up to the count, in batches however many are past it", async () => {
    // 2,400 rows past a count of 100, deleted 1,000 at a time: two whole batches and a part.
    await append(ledger, 2_500, "beta");
    const last = await ledger.events.lastSeq();
    const retention = { maxAgeMs: undefined, maxRows: 100 };
    expect(await pruneEvents(ledger.events, retention, log, Date.now(), 1000)).toBe(2_400);
    const left = await ledger.events.page(0, { tenant: null }, 1000);
    expect(left).toHaveLength(100);
    expect(left[0]?.seq).toBe(last - 99);
    expect(logged.at(-1)).toEqual({ event: "events_pruned", rows: 2_400, kept_from: last - 99 });
    expect(await pruneEvents(ledger.events, retention, log, Date.now(), 1000)).toBe(0);
  }, 60_000);

  it("deletes rows older than the age", async () => {
    await append(ledger, 10, "beta");
    const day = 86_400_000;
    // A day on, with a week's retention, nothing is old enough; eight days on, all of it is.
    expect(await pruneEvents(ledger.events, { maxAgeMs: 7 * day, maxRows: undefined }, log, Date.now() + day)).toBe(0);
    expect(await pruneEvents(ledger.events, { maxAgeMs: 7 * day, maxRows: undefined }, log, Date.now() + 8 * day)).toBe(
      10,
    );
    // The sequence goes on after a prune of everything.
    expect((await ledger.insertEvent("sandbox.created", null, {}, "beta")).seq).toBe(11);
  });
});

describe("event retention's setting", () => {
  it("is read from BOTHY_EVENTS_RETENTION: an age, a count, or both; anything else stops start-up", () => {
    expect(loadConfig({}).eventRetention).toEqual({ maxAgeMs: 7 * 86_400_000, maxRows: 1_000_000 });
    expect(parseRetention("12h")).toEqual({ maxAgeMs: 12 * 3_600_000, maxRows: undefined });
    expect(parseRetention("5000")).toEqual({ maxAgeMs: undefined, maxRows: 5000 });
    expect(parseRetention("90m, 20")).toEqual({ maxAgeMs: 90 * 60_000, maxRows: 20 });
    expect(() => loadConfig({ BOTHY_EVENTS_RETENTION: "forever" })).toThrow(
      /BOTHY_EVENTS_RETENTION: "forever" is neither an age/,
    );
    expect(() => loadConfig({ BOTHY_EVENTS_RETENTION: "7d,1d" })).toThrow(/one age only/);
    expect(() => loadConfig({ BOTHY_EVENTS_RETENTION: "0" })).toThrow(/BOTHY_EVENTS_RETENTION/);
  });
});
