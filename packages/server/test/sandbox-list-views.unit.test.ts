/**
 * What GET /sandboxes reads for a list, on both stores: the lifecycle rows of many sandboxes in a
 * few queries (across the batch of ids bound in one `IN`), and each row's effective host policy
 * with its tenant's default read once, the same as reading it row by row.
 */
import { describe, expect, it } from "vitest";
import { GatewayPolicies } from "../src/gateway/policies.ts";
import { insertStoreSandbox, STORES, useStores } from "./helpers/stores.ts";

const stores = useStores();
const idOf = (i: number): string =>
  `sbx_${String(i)
    .padStart(20, "0")
    .replace(/\d/g, (d) => "abcdefghij"[Number(d)]!)}`;

describe.each(STORES)("a list's views on the %s store", (kind) => {
  it("reads the lifecycle rows of 620 sandboxes by id, and policies as row by row", async () => {
    const store = await stores.open(kind);
    await store.auth.insertTenant("beta", "{}");
    await store.auth.setTenantPolicy("beta", JSON.stringify({ rules: [{ host: "*.example.test", action: "ask" }] }));
    const ids = Array.from({ length: 620 }, (_, i) => idOf(i));
    for (const [i, id] of ids.entries()) {
      const policy = i % 3 === 0 ? JSON.stringify({ policy: { deny_hosts: ["evil.test"] }, secrets: ["TOKEN"] }) : null;
      await insertStoreSandbox(store, { id, tenant: i % 2 === 0 ? "beta" : "default", policy });
      if (i % 100 === 7)
        await store.lifecycle.put({
          sandbox_id: id,
          on_timeout: "sleep",
          auto_wake: 0,
          timeout_s: 60,
          asleep_by: null,
        });
    }
    const found = await store.lifecycle.ofMany(ids);
    expect([...found.keys()].sort()).toEqual(ids.filter((_, i) => i % 100 === 7).sort());
    expect(found.get(idOf(507))).toMatchObject({ on_timeout: "sleep", auto_wake: 0, timeout_s: 60 });
    expect((await store.lifecycle.ofMany([])).size).toBe(0);

    const policies = new GatewayPolicies(store);
    const rows = (await store.listSandboxes()).slice(0, 12);
    expect(await policies.ofRows(rows)).toEqual(await Promise.all(rows.map((r) => policies.ofRow(r))));
  }, 60_000);
});
