/**
 * The cluster's events on a real PostgreSQL 15, two stores (two nodes' pools) on one database:
 * inserts from both commit in `seq` order, so a reader paging `seq > last` never passes a row that
 * commits later; an EventBus follows every node's events in order, once each, woken by the
 * inserts' notifications, and again after its listening connection is cut. On SQLite, followers
 * hear the process's own publishes as before. Every wait has a deadline.
 */
import { afterAll, describe, expect, it } from "vitest";
import type { BothyEvent } from "@bothy/protocol";
import { EventBus } from "../src/events/event-bus.ts";
import { all } from "../src/ledger/sql-step.ts";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { useStores } from "./helpers/stores.ts";

const stores = useStores();
let databases = 0;

/** Two stores (as two nodes hold them) on one fresh database. */
async function twoNodes(): Promise<[LedgerStore, LedgerStore]> {
  const url = await stores.postgres().createDatabase(`events_${++databases}`);
  const a = await openStore({ databaseUrl: url, sqlitePath: "" });
  const b = await openStore({ databaseUrl: url, sqlitePath: "", poolSize: 10 });
  opened.push(a, b);
  return [a, b];
}
const opened: LedgerStore[] = [];
afterAll(async () => {
  await Promise.all(opened.map((s) => s.close()));
});

async function allSeqs(store: LedgerStore): Promise<number[]> {
  return (
    await store.transaction(function* () {
      return yield* all<{ seq: number }>(`SELECT seq FROM events ORDER BY seq`);
    })
  ).map((r) => r.seq);
}

/** Resolves once `done()` holds, checked every 50 ms; fails after `ms`. */
async function until(what: string, done: () => boolean, ms = 30_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!done()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

describe("events across nodes (PostgreSQL)", { timeout: 60_000 }, () => {
  it("inserts from two nodes commit in seq order: a reader paging seq > last never passes a row", async () => {
    const [a, b] = await twoNodes();
    const seen: number[] = [];
    let writing = true;
    // The reader pages as a stream does, as fast as it can, while both nodes insert at once.
    const reader = (async () => {
      let last = 0;
      for (;;) {
        const stillWriting = writing;
        const rows = await a.events.page(last, { tenant: null }, 100);
        for (const row of rows) {
          seen.push(row.seq);
          last = row.seq;
        }
        if (!stillWriting && rows.length < 100) return;
      }
    })();
    const burst = (store: LedgerStore, n: number) =>
      Promise.all(Array.from({ length: n }, (_, i) => store.insertEvent("sandbox.created", null, { i })));
    for (let round = 0; round < 10; round++) await Promise.all([burst(a, 30), burst(b, 30)]);
    writing = false;
    await reader;
    const stored = await allSeqs(a);
    expect(stored).toHaveLength(600);
    // Every committed row was read, in order, once.
    expect(seen).toEqual(stored);
  });

  it("a node's followers get every node's events, in seq order, once each", async () => {
    const [a, b] = await twoNodes();
    const busA = new EventBus(a);
    const busB = new EventBus(b);
    const followed: Array<{ event: BothyEvent; tenant: string | null }> = [];
    const own: BothyEvent[] = [];
    busA.follow((event, tenant) => followed.push({ event, tenant }));
    busA.subscribe((event) => own.push(event));
    try {
      await Promise.all([
        ...Array.from({ length: 40 }, (_, i) =>
          busB.publish("sandbox.created", null, { i, t: "tenant-b" }, "tenant-b"),
        ),
        ...Array.from({ length: 40 }, (_, i) =>
          busA.publish("sandbox.created", null, { i, t: "tenant-a" }, "tenant-a"),
        ),
      ]);
      const stored = await allSeqs(a);
      await until("node A's followers to hear all 80", () => followed.length >= stored.length);
      expect(followed.map((f) => f.event.seq)).toEqual(stored);
      // Each event with the tenant its row holds: a stream's filter reads it.
      for (const f of followed) expect(f.tenant).toBe(f.event.data["t"]);
      // Subscribers (the webhook) hear only this node's own.
      expect(own).toHaveLength(40);
    } finally {
      busA.close();
      busB.close();
    }
  });

  it("after its listening connection is cut, a node's feed connects again and delivers what was missed", async () => {
    const [a, b] = await twoNodes();
    const busA = new EventBus(a);
    const busB = new EventBus(b);
    const followed: number[] = [];
    busA.follow((event) => followed.push(event.seq));
    try {
      await busB.publish("sandbox.created", null, { before: true }, "t");
      await until("the first event", () => followed.length === 1);
      // The listener is the one session that runs LISTEN; cutting it loses notifications meanwhile.
      const cut = await b.transaction(function* () {
        return yield* all<{ cut: boolean }>(
          `SELECT pg_terminate_backend(pid) AS cut FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND datname = current_database()`,
        );
      });
      expect(cut.length).toBeGreaterThanOrEqual(1);
      for (let i = 0; i < 5; i++) await busB.publish("sandbox.created", null, { i }, "t");
      await until("the events published while it was cut", () => followed.length === 6, 20_000);
      expect(followed).toEqual(await allSeqs(a));
    } finally {
      busA.close();
      busB.close();
    }
  });
});

describe("events on one node (SQLite)", () => {
  it("followers hear the process's own publishes, in order", async () => {
    const store = await openStore({ sqlitePath: ":memory:" });
    const bus = new EventBus(store);
    const followed: number[] = [];
    bus.follow((event) => followed.push(event.seq));
    try {
      await Promise.all(Array.from({ length: 10 }, (_, i) => bus.publish("sandbox.created", null, { i })));
      expect(followed).toEqual(await allSeqs(store));
    } finally {
      bus.close();
      await store.close();
    }
  });
});
