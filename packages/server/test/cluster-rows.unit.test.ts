/**
 * The cluster's rows on both stores (a real PostgreSQL 15 for this file, SQLite in memory): a node's
 * lease is taken only once the last holding lapsed, each holding in the next epoch; the fence refuses
 * a write of an epoch that no longer holds, or for a sandbox not its own; readers see a lapsed node's
 * sandboxes stopped; the leader's lease passes the same way. Leases are lapsed by taking them for 0 ms
 * (the database's clock ends them at once), so nothing here waits on time.
 */
import { describe, expect, it } from "vitest";
import { Fence } from "../src/cluster/fence.ts";
import { NodeQueries, type NodeInfo } from "../src/ledger/node-rows.ts";
import { PgRunner } from "../src/ledger/pg-runner.ts";
import { openStore } from "../src/ledger/store.ts";
import { SandboxQueries } from "../src/ledger/sandbox-rows.ts";
import { TEST_SANDBOX_ROW } from "./helpers/ledger-rows.ts";
import { STORES, useStores } from "./helpers/stores.ts";

const stores = useStores();
const sandboxes = new SandboxQueries();
const LONG = 60_000;

const info = (id: string): NodeInfo => ({
  id,
  url: `http://${id}.test:8080`,
  drivers: ["gvisor", "qemu"],
  templates: ["seed"],
  vcpu: 4,
  memoryMib: 8192,
  slots: 32,
});

describe.each(STORES)("the %s store's cluster rows", (kind) => {
  it("a node's lease: taken once, the next epoch only after the last holding lapsed; heartbeats renew only the holder", async () => {
    const store = await stores.open(kind);
    const before = await store.nodes.now();
    expect(await store.nodes.acquire(info("n1"), 0)).toMatchObject({ epoch: 1 });
    const second = await store.nodes.acquire(info("n1"), LONG);
    expect(second?.epoch).toBe(2);
    expect(second?.expiresAt).toBeGreaterThanOrEqual(before + LONG);
    expect(await store.nodes.acquire(info("n1"), LONG)).toBeUndefined();
    expect(await store.nodes.heartbeat("n1", 1, LONG, { templates: [], slots: 1 })).toBeUndefined();
    expect(await store.nodes.heartbeat("n1", 2, LONG, { templates: ["seed", "desktop"], slots: 30 })).toBeGreaterThan(
      before,
    );
    expect(await store.nodes.holds("n1", 2)).toBe(true);
    expect(await store.nodes.holds("n1", 1)).toBe(false);
    const [row] = await store.nodes.nodes();
    expect(row).toMatchObject({ id: "n1", epoch: 2, lapsed: false, slots: 30, templates: '["seed","desktop"]' });
    expect(JSON.parse(row?.drivers ?? "")).toEqual(["gvisor", "qemu"]);
    // A clean stop hands it back at once.
    expect(await store.nodes.release("n1", 2)).toBe(true);
    expect(await store.nodes.holds("n1", 2)).toBe(false);
    expect(await store.nodes.acquire(info("n1"), LONG)).toMatchObject({ epoch: 3 });
  });

  it("the fence: a write of an epoch that lost the lease, or for another node's sandbox, changes nothing", async () => {
    const store = await stores.open(kind);
    await store.nodes.acquire(info("n1"), 0);
    let epoch: number | undefined = 1;
    const stale = new Fence(store, "n1", () => epoch);
    await expect(stale.insertSandbox({ ...TEST_SANDBOX_ROW, id: "sbx_cccccccccccccccccccc" })).rejects.toMatchObject({
      code: "lease_lost",
    });
    expect(await store.getSandbox("sbx_cccccccccccccccccccc")).toBeUndefined();

    await store.nodes.acquire(info("n1"), LONG);
    epoch = 2;
    const row = await stale.insertSandbox({ ...TEST_SANDBOX_ROW, id: "sbx_cccccccccccccccccccc" });
    expect(row).toMatchObject({ node_id: "n1", node_epoch: 2 });
    expect(await store.getSandbox(row.id)).toEqual(row);
    await stale.write(row.id, () => sandboxes.setExpiresAt(row.id, "2030-01-01T00:00:00.000Z"));

    // The node's next holding (a restart) takes its sandboxes over; the old holding's writes are refused.
    await store.nodes.release("n1", 2);
    await store.nodes.acquire(info("n1"), LONG);
    expect(await store.nodes.claimSandboxes("n1", 3)).toBe(1);
    // A holding that lost the lease (paused between its acquire and its claim) takes nothing back.
    expect(await store.nodes.claimSandboxes("n1", 2)).toBe(0);
    await expect(stale.write(row.id, () => sandboxes.setExpiresAt(row.id, "stale"))).rejects.toMatchObject({
      code: "lease_lost",
    });
    const successor = new Fence(store, "n1", () => 3);
    await successor.write(row.id, () => sandboxes.setExpiresAt(row.id, "successor"));
    expect(await store.getSandbox(row.id)).toMatchObject({ expires_at: "successor", node_epoch: 3 });

    // Another node holding its own lease still cannot write for n1's sandbox.
    await store.nodes.acquire(info("n2"), LONG);
    const other = new Fence(store, "n2", () => 1);
    await expect(other.write(row.id, () => sandboxes.setExpiresAt(row.id, "n2"))).rejects.toMatchObject({
      code: "lease_lost",
    });
    epoch = undefined;
    await expect(stale.write(row.id, () => sandboxes.setExpiresAt(row.id, "none"))).rejects.toMatchObject({
      code: "lease_lost",
    });
    expect(await store.getSandbox(row.id)).toMatchObject({ expires_at: "successor" });
  });

  it("readers see a lapsed node's sandboxes stopped (not those deleting or gone), a single machine's as they are", async () => {
    const store = await stores.open(kind);
    await store.nodes.acquire(info("n1"), LONG);
    const fence = new Fence(store, "n1", () => 1);
    await fence.insertSandbox({ ...TEST_SANDBOX_ROW, id: "sbx_dddddddddddddddddddd" });
    await fence.insertSandbox({ ...TEST_SANDBOX_ROW, id: "sbx_eeeeeeeeeeeeeeeeeeee" });
    await store.transition("sbx_eeeeeeeeeeeeeeeeeeee", "running", "deleting");
    await store.insertSandbox({ ...TEST_SANDBOX_ROW, id: "sbx_ffffffffffffffffffff" });
    const states = async (): Promise<string[]> =>
      (await store.nodes.seenSandboxes()).map((s) => `${s.id.slice(4, 5)} ${s.state} ${s.node_lapsed}`).sort();
    expect(await states()).toEqual(["d running false", "e deleting false", "f running false"]);
    await store.nodes.release("n1", 1);
    expect(await states()).toEqual(["d stopped true", "e deleting true", "f running false"]);
    expect(await store.nodes.seenSandbox("sbx_dddddddddddddddddddd")).toMatchObject({ state: "stopped" });
    expect(await store.getSandbox("sbx_dddddddddddddddddddd")).toMatchObject({ state: "running" });
  });

  it("the leader's lease: one holder at a time, the next epoch after a lapse; renewal only by the holder", async () => {
    const store = await stores.open(kind);
    expect(await store.clusterLeases.acquire("leader", "n1/1", 0)).toMatchObject({ epoch: 1 });
    expect(await store.clusterLeases.renew("leader", 1, LONG)).toBeUndefined();
    expect(await store.clusterLeases.acquire("leader", "n2/2", LONG)).toMatchObject({ epoch: 2 });
    expect(await store.clusterLeases.acquire("leader", "n1/1", LONG)).toBeUndefined();
    expect(await store.clusterLeases.renew("leader", 2, LONG)).toBeGreaterThan(0);
    expect(await store.clusterLeases.holds("leader", 2)).toBe(true);
    expect(await store.clusterLeases.holds("leader", 1)).toBe(false);
    expect(await store.clusterLeases.lease("leader")).toMatchObject({ holder: "n2/2", epoch: 2, lapsed: false });
    expect(await store.clusterLeases.release("leader", 2)).toBe(true);
    expect(await store.clusterLeases.lease("leader")).toMatchObject({ lapsed: true });
  });
});

describe("PostgreSQL: the fence's check and its write are one transaction", () => {
  it("a successor's taking of the lease waits for a fenced transaction in flight to commit", async () => {
    const url = await stores.postgres().createDatabase("fence_lock");
    const store = await openStore({ databaseUrl: url, sqlitePath: "" });
    const pool = PgRunner.pool(url, 1);
    const client = await pool.connect();
    try {
      await store.nodes.acquire(info("n1"), 300);
      // A fenced write's first step, the fence's own check, in a transaction left open.
      await client.query("BEGIN");
      expect(await new PgRunner(pool).run(new NodeQueries().holds("n1", 1), client)).toBe(true);
      // The lease lapses (by the database's clock) while the transaction is open; a successor tries to take it.
      await (async () => {
        for (;;) {
          if (!(await store.nodes.holds("n1", 1))) return;
          await new Promise((resolve) => setTimeout(resolve, 25));
        }
      })();
      let taken = false;
      const successor = store.nodes.acquire(info("n1"), LONG).then((got) => {
        taken = true;
        return got;
      });
      // It cannot land while the fenced transaction holds the row: it waits on the lock (pg_locks shows it).
      while (!taken) {
        const waiting = await client.query(`SELECT 1 FROM pg_locks WHERE NOT granted`);
        if ((waiting.rowCount ?? 0) > 0) break;
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      expect(taken).toBe(false);
      await client.query("COMMIT");
      expect(await successor).toMatchObject({ epoch: 2 });
    } finally {
      client.release();
      await pool.end();
      await store.close();
    }
  });
});
