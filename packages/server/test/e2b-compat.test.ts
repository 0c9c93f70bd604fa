import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Sandbox, SandboxNotFoundError } from "e2b";
import { noLeaks } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

/**
 * The real `e2b` SDK against a real bothy (gVisor), configured only as an E2B user would:
 * E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY.
 */
describe("E2B compatibility (e2b SDK 2.51, gVisor)", () => {
  let ts: TestServer;
  const saved: Record<string, string | undefined> = {};
  const E2B_ENV = ["E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DOMAIN", "E2B_DEBUG"] as const;

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor" });
    for (const name of E2B_ENV) saved[name] = process.env[name];
    delete process.env["E2B_DOMAIN"];
    delete process.env["E2B_DEBUG"];
    process.env["E2B_API_URL"] = `${ts.url}/e2b`;
    process.env["E2B_SANDBOX_URL"] = `${ts.url}/e2b/envd`;
    // bothy has no API keys yet: any key is accepted.
    process.env["E2B_API_KEY"] = "e2b_0000000000000000000000000000000000000000";
  });

  afterAll(async () => {
    for (const name of E2B_ENV) {
      if (saved[name] === undefined) delete process.env[name];
      else process.env[name] = saved[name];
    }
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  /** A sandbox for one test, killed afterwards whatever happens. */
  async function withSandbox<T>(
    opts: Parameters<typeof Sandbox.create>[1],
    use: (sbx: Sandbox) => Promise<T>,
  ): Promise<T> {
    const sbx = await Sandbox.create("base", opts);
    try {
      return await use(sbx);
    } catch (err) {
      console.error(`failed with sandbox ${sbx.sandboxId}`);
      throw err;
    } finally {
      await sbx.kill();
    }
  }

  describe("control plane", () => {
    it("creates with timeout and metadata; getInfo shows them", async () => {
      await withSandbox({ timeoutMs: 120_000, metadata: { suite: "e2b", case: "info" } }, async (sbx) => {
        expect(sbx.sandboxId).toMatch(/^sbx_/);
        const info = await sbx.getInfo();
        expect(info).toMatchObject({
          sandboxId: sbx.sandboxId,
          templateId: "seed",
          metadata: { suite: "e2b", case: "info" },
          state: "running",
          cpuCount: 1,
        });
        const lifetime = info.endAt.getTime() - info.startedAt.getTime();
        expect(lifetime).toBeGreaterThan(100_000);
        expect(lifetime).toBeLessThan(200_000);
      });
    });

    it("setTimeout moves the end of the sandbox's life", async () => {
      await withSandbox({ timeoutMs: 60_000 }, async (sbx) => {
        const before = (await sbx.getInfo()).endAt.getTime();
        await sbx.setTimeout(3_600_000);
        const after = (await sbx.getInfo()).endAt.getTime();
        expect(after - before).toBeGreaterThan(3_000_000);
      });
    });

    it("lists by metadata, a page at a time", async () => {
      const tag = `list-${Date.now()}`;
      const made: Sandbox[] = [];
      try {
        for (let i = 0; i < 3; i++) made.push(await Sandbox.create("base", { metadata: { tag, n: String(i) } }));
        const other = await Sandbox.create("base", { metadata: { tag: `${tag}-other` } });
        made.push(other);

        const all = Sandbox.list({ query: { metadata: { tag } } });
        const firstPage = await all.nextItems();
        expect(firstPage.map((s) => s.sandboxId).sort()).toEqual(
          made
            .slice(0, 3)
            .map((s) => s.sandboxId)
            .sort(),
        );
        expect(all.hasNext).toBe(false);

        const paged = Sandbox.list({ query: { metadata: { tag } }, limit: 2 });
        const seen: string[] = [];
        let pages = 0;
        while (paged.hasNext) {
          seen.push(...(await paged.nextItems()).map((s) => s.sandboxId));
          pages++;
        }
        expect(pages).toBe(2);
        expect(seen.sort()).toEqual(firstPage.map((s) => s.sandboxId).sort());

        const one = await Sandbox.list({ query: { metadata: { tag, n: "1" } } }).nextItems();
        expect(one.map((s) => s.sandboxId)).toEqual([made[1]?.sandboxId]);
        const paused = await Sandbox.list({ query: { metadata: { tag }, state: ["paused"] } }).nextItems();
        expect(paused).toEqual([]);
      } finally {
        for (const sbx of made) await sbx.kill();
      }
    });

    it("kill twice: true, then false; a killed sandbox is not found", async () => {
      const sbx = await Sandbox.create("base");
      try {
        expect(await sbx.kill()).toBe(true);
      } finally {
        expect(await Sandbox.kill(sbx.sandboxId)).toBe(false);
      }
      await expect(sbx.getInfo()).rejects.toBeInstanceOf(SandboxNotFoundError);
      await expect(sbx.setTimeout(60_000)).rejects.toBeInstanceOf(SandboxNotFoundError);
      await expect(Sandbox.getInfo("sbx_doesnotexist")).rejects.toBeInstanceOf(SandboxNotFoundError);
      expect(await Sandbox.kill("sbx_doesnotexist")).toBe(false);
    });

    it("refuses what bothy cannot honour with E2B's error shape", async () => {
      const res = await fetch(`${ts.url}/e2b/v2/sandboxes`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-api-key": "e2b_0" },
        body: JSON.stringify({ templateID: "base", metadata: { "a b": "c" } }),
      });
      expect(res.status).toBe(400);
      const body = (await res.json()) as { code: number; message: string };
      expect(body.code).toBe(400);
      expect(body.message).toMatch(/metadata/);
      const missing = await fetch(`${ts.url}/e2b/no/such/route`);
      expect(missing.status).toBe(404);
      expect(await missing.json()).toMatchObject({ code: 404 });
    });
  });
});
