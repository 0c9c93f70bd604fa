/**
 * E2B's snapshot calls (`e2b` 2.51) on bothy's snapshots, gVisor: createSnapshot, a sandbox
 * started from one, listSnapshots, fork and deleteSnapshot, driven by the real SDK; from the
 * attacker's side, another tenant's key sees none of them.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Sandbox, SandboxError } from "e2b";
import { api, waitDeleted } from "./helpers/client.ts";
import { useE2bEnv } from "./helpers/e2b-env.ts";
import { testAdminKey } from "../../../test/auth.ts";
import { noLeaks } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

describe("E2B snapshots and fork (e2b SDK 2.51, gVisor)", () => {
  let ts: TestServer;
  let restoreEnv: () => void;
  let bKey = "";

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor" });
    restoreEnv = useE2bEnv(ts.url);
    expect((await api(ts.url, "POST", "/tenants", { tenant: "b" })).status).toBe(201);
    const key = await api(ts.url, "POST", "/keys", { tenant: "b", name: "b" });
    bKey = String(key.json["key"]);
  });

  afterAll(async () => {
    restoreEnv?.();
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  it("createSnapshot, create from it, listSnapshots, fork, deleteSnapshot; tenant b sees none of it", async () => {
    const sbx = await Sandbox.create("base", { timeoutMs: 600_000, envs: { FROM: "parent" } });
    const made: Sandbox[] = [];
    try {
      await sbx.files.write("state.txt", "prepared");
      const snap = await sbx.createSnapshot({ name: "prepared" });
      expect(snap.snapshotId).toMatch(/^snap_/);
      expect(snap.names).toEqual(["prepared"]);

      const child = await Sandbox.create(snap.snapshotId, { timeoutMs: 600_000 });
      made.push(child);
      expect(await child.files.read("state.txt")).toBe("prepared");
      await child.files.write("state.txt", "child's own");
      expect(await sbx.files.read("state.txt")).toBe("prepared");

      const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems();
      expect(listed).toEqual([{ snapshotId: snap.snapshotId, names: ["prepared"] }]);
      // The wire also says the snapshot kept no memory (gVisor), a field the SDK passes over.
      const raw = await fetch(`${ts.url}/e2b/snapshots`, { headers: { "x-api-key": testAdminKey() } });
      expect(await raw.json()).toEqual([{ snapshotID: snap.snapshotId, names: ["prepared"], memory: false }]);

      const forks = await Sandbox.fork(sbx.sandboxId, { count: 2, timeoutMs: 600_000 });
      expect(forks).toHaveLength(2);
      for (const fork of forks) {
        if (!(fork instanceof Sandbox)) throw fork;
        made.push(fork);
        expect(await fork.files.read("state.txt")).toBe("prepared");
        expect((await fork.commands.run("echo $FROM")).stdout).toBe("parent\n");
      }

      // Tenant b: no snapshot listed, none deletable, none to start from, no fork of a's sandbox.
      const asB = { apiKey: bKey };
      expect(await Sandbox.listSnapshots(asB).nextItems()).toEqual([]);
      expect(await Sandbox.deleteSnapshot(snap.snapshotId, asB)).toBe(false);
      await expect(Sandbox.create(snap.snapshotId, asB)).rejects.toBeInstanceOf(SandboxError);
      await expect(Sandbox.fork(sbx.sandboxId, { ...asB, count: 1 })).rejects.toBeInstanceOf(SandboxError);

      // In use by the child: refused; once it is gone, deleted; then gone.
      await expect(Sandbox.deleteSnapshot(snap.snapshotId)).rejects.toThrow(/^409: .*in use/);
      await child.kill();
      made.splice(made.indexOf(child), 1);
      // Its use of the snapshot ends with its row's delete, which finishes after kill answers.
      await waitDeleted(ts.url, child.sandboxId);
      expect(await Sandbox.deleteSnapshot(snap.snapshotId)).toBe(true);
      expect(await Sandbox.deleteSnapshot(snap.snapshotId)).toBe(false);
    } finally {
      for (const s of made) await s.kill();
      await sbx.kill();
    }
  });
});
