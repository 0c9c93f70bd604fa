/**
 * Deleting a tenant in the ledger, on both stores: refused, with counts, while it holds live
 * sandboxes, unrevoked keys, secrets, volumes or snapshots; once it holds none, its row goes with
 * its revoked keys and their sessions in one transaction, and the history left under its name
 * keeps the name from being given to a new tenant (which would read that history).
 */
import { describe, expect, it } from "vitest";
import { insertStoreSandbox, STORES, useStores } from "./helpers/stores.ts";

const stores = useStores();
const T = "2026-12-04T10:00:00.000Z";
const SBX = "sbx_bbbbbbbbbbbbbbbbbbbb";
const NOTHING = { sandboxes: 0, keys: 0, secrets: 0, volumes: 0, snapshots: 0 };

describe.each(STORES)("deleting a tenant on the %s store", (kind) => {
  it("is refused while it holds anything, then removes it with its revoked keys and their sessions", async () => {
    const store = await stores.open(kind);
    expect(await store.auth.deleteTenant("nobody")).toBeUndefined();
    await store.auth.insertTenant("beta", "{}");
    await store.auth.insertKey({
      id: "key_b",
      tenant: "beta",
      name: "ci",
      digest: "db",
      prefix: "bthy_",
      last4: "abcd",
      scopes: "sandboxes:read",
      created_at: T,
      expires_at: null,
    });
    await store.sessions.insert({
      digest: "sb",
      key_id: "key_b",
      created_at: T,
      expires_at: "2999-01-01T00:00:00.000Z",
    });
    await insertStoreSandbox(store, { id: SBX, tenant: "beta" });
    await store.secrets.put({ tenant: "beta", name: "TOKEN", sealed: Buffer.from([1]), hosts: "[]", inject: null });
    await store.volumes.insert({ id: "vol_b", tenant: "beta", name: "data", size_mib: 64, created_at: T });
    expect(await store.auth.deleteTenant("beta")).toEqual({
      ...NOTHING,
      sandboxes: 1,
      keys: 1,
      secrets: 1,
      volumes: 1,
    });

    // Each holding let go in turn; the refusal names only what is left.
    await store.transition(SBX, "running", "deleting");
    await store.transition(SBX, "deleting", "deleted");
    await store.auth.revokeKey("key_b");
    await store.secrets.delete("beta", "TOKEN");
    expect(await store.auth.deleteTenant("beta")).toEqual({ ...NOTHING, volumes: 1 });
    expect(await store.volumes.remove("vol_b")).toEqual([]);
    expect(await store.auth.deleteTenant("beta")).toBe("deleted");

    expect(await store.auth.tenant("beta")).toBeUndefined();
    expect(await store.auth.key("key_b")).toBeUndefined();
    expect(await store.sessions.get("sb")).toBeUndefined();
    // Its deleted sandbox is history under its name: the name is not free again.
    expect(await store.auth.sandboxTenant(SBX)).toBe("beta");
    expect(await store.auth.tenantHasHistory("beta")).toBe(true);
    expect(await store.auth.tenantHasHistory("gamma")).toBe(false);
  });
});
