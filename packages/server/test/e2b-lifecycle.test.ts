/**
 * `lifecycle.onTimeout: "pause"` and auto-resume, driven by the real `e2b` SDK (2.51) and by
 * bothy's own API (`on_timeout`, `auto_wake`), on gVisor: a sandbox's timeout puts it to sleep
 * instead of deleting it, the next call wakes it (or, without auto-resume, is refused as E2B's
 * proxy refuses it until `Sandbox.connect`), and it gets its timeout again. From the attacker's
 * side: another tenant's key cannot wake it (404), and a port request without a credential for
 * the sandbox wakes nothing.
 *
 * A timeout is made to pass by moving the row's `expires_at` into the past, so no test waits for
 * a clock; the sweeper (every second here) then acts on it, and tests poll for the result.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConflictError, Sandbox as BothySandbox } from "@bothy/sdk";
import { Sandbox, SandboxError } from "e2b";
import { ANONYMOUS } from "../../../test/auth.ts";
import { api, pollUntil, runCommand } from "./helpers/client.ts";
import { useE2bEnv } from "./helpers/e2b-env.ts";
import { noLeaks } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

const DAY_MS = 86_400_000;

describe("sleep at the timeout and wake on the next call (e2b SDK 2.51 and bothy's API, gVisor)", () => {
  let ts: TestServer;
  let restoreEnv: () => void;
  let bKey = "";

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor", BOTHY_SWEEP_INTERVAL_S: "1" });
    restoreEnv = useE2bEnv(ts.url);
    expect((await api(ts.url, "POST", "/tenants", { tenant: "b" })).status).toBe(201);
    const key = await api(ts.url, "POST", "/keys", { tenant: "b", name: "b" });
    expect(key.status).toBe(201);
    bKey = String(key.json["key"]);
  });

  afterAll(async () => {
    restoreEnv?.();
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  /** Its timeout passes now: the next sweep finds it expired. */
  async function expireNow(id: string): Promise<void> {
    await ts.server.ledger.setExpiresAt(id, new Date(Date.now() - 1000).toISOString());
  }

  async function row(id: string): Promise<{ state: string; expiresAt: number }> {
    const r = await ts.server.ledger.getSandbox(id);
    if (!r) throw new Error(`no row for ${id}`);
    return { state: r.state, expiresAt: Date.parse(r.expires_at ?? "") };
  }

  /** Stopped (gVisor's sleep) and marked asleep since its timeout, with its final deadline set. */
  async function waitAsleep(id: string): Promise<void> {
    await pollUntil(
      `${id} asleep after its timeout`,
      async () =>
        (await row(id)).state === "stopped" && (await ts.server.ledger.lifecycle.of(id))?.asleep_by === "timeout",
    );
  }

  /** An envd request as the SDK sends it, by hand: a sandbox's id and token in E2B's headers. */
  function envd(id: string, token: string, path: string, port = "49983"): Promise<Response> {
    return fetch(`${ts.url}/e2b/envd${path}`, {
      headers: { "e2b-sandbox-id": id, "e2b-sandbox-port": port, "x-access-token": token },
    });
  }

  it("onTimeout pause with autoResume: asleep (not deleted) at its timeout; commands.run wakes it with its files and a fresh timeout", async () => {
    const sbx = await Sandbox.create("base", {
      timeoutMs: 600_000,
      lifecycle: { onTimeout: "pause", autoResume: true },
    });
    try {
      expect((await sbx.getInfo()).lifecycle).toEqual({ onTimeout: "pause", autoResume: true });
      await sbx.files.write("kept.txt", "before the timeout");
      await expireNow(sbx.sandboxId);
      await waitAsleep(sbx.sandboxId);
      expect((await sbx.getInfo()).state).toBe("paused");
      // Kept for BOTHY_SLEEP_RETENTION_S (30 days by default), then deleted.
      expect((await row(sbx.sandboxId)).expiresAt).toBeGreaterThan(Date.now() + 29 * DAY_MS);

      const r = await sbx.commands.run("cat kept.txt");
      expect(r.stdout).toBe("before the timeout");
      const info = await sbx.getInfo();
      expect(info.state).toBe("running");
      // Its timeout again (600 s), not the retention.
      expect(info.endAt.getTime()).toBeGreaterThan(Date.now() + 500_000);
      expect(info.endAt.getTime()).toBeLessThan(Date.now() + 700_000);
    } finally {
      await sbx.kill();
    }
  });

  it("a port request with the sandbox's token wakes it; one without a credential is refused and wakes nothing", async () => {
    const sbx = await Sandbox.create("base", {
      timeoutMs: 600_000,
      lifecycle: { onTimeout: "pause", autoResume: true },
    });
    try {
      await expireNow(sbx.sandboxId);
      await waitAsleep(sbx.sandboxId);
      const token = String((await api(ts.url, "GET", `/e2b/sandboxes/${sbx.sandboxId}`)).json["envdAccessToken"]);

      // A stranger: no token, a wrong one, another sandbox's; and bothy's own port URL with no key.
      for (const wrong of ["", "v2.forged.token"]) {
        const res = await envd(sbx.sandboxId, wrong, "/", "8080");
        expect(res.status).toBe(401);
      }
      const anonymous = await fetch(`${ts.url}/sandboxes/${sbx.sandboxId}/ports/8080/`, { headers: ANONYMOUS });
      expect(anonymous.status).toBe(401);
      expect((await row(sbx.sandboxId)).state).toBe("stopped");

      // The SDK's form for a server inside the sandbox (getHost's traffic through E2B_SANDBOX_URL).
      const res = await envd(sbx.sandboxId, token, "/", "8080");
      // Woken, and nothing listens on 8080 in it (its processes ended with the sleep).
      expect(res.status).toBe(502);
      expect(((await res.json()) as { code: string }).code).toBe("port_not_listening");
      expect((await row(sbx.sandboxId)).state).toBe("running");
    } finally {
      await sbx.kill();
    }
  });

  it("without autoResume an envd call is refused as E2B's proxy refuses it (409, paused), and wakes nothing; connect resumes it", async () => {
    const sbx = await Sandbox.create("base", { timeoutMs: 600_000, lifecycle: { onTimeout: "pause" } });
    try {
      expect((await sbx.getInfo()).lifecycle).toEqual({ onTimeout: "pause", autoResume: false });
      await sbx.files.write("kept.txt", "still here");
      await expireNow(sbx.sandboxId);
      await waitAsleep(sbx.sandboxId);

      const token = String((await api(ts.url, "GET", `/e2b/sandboxes/${sbx.sandboxId}`)).json["envdAccessToken"]);
      const health = await envd(sbx.sandboxId, token, "/health");
      expect(health.status).toBe(409);
      expect(await health.json()).toEqual({
        sandboxId: sbx.sandboxId,
        canAutoResume: false,
        code: 409,
        message: expect.stringContaining("Sandbox.connect") as unknown,
      });
      const err = await sbx.commands.run("true").catch((e: unknown) => e);
      expect(err).toBeInstanceOf(SandboxError);
      await expect(sbx.files.read("kept.txt")).rejects.toThrow(/paused/);
      // bothy's own API and its port URLs refuse it too.
      const cmd = await api(ts.url, "POST", `/sandboxes/${sbx.sandboxId}/commands`, { cmd: "true" });
      expect(cmd.status).toBe(409);
      expect(cmd.json["code"]).toBe("sandbox_asleep");
      expect((await envd(sbx.sandboxId, token, "/", "8080")).status).toBe(409);
      expect((await row(sbx.sandboxId)).state).toBe("stopped");

      const resumed = await Sandbox.connect(sbx.sandboxId);
      expect(await resumed.files.read("kept.txt")).toBe("still here");
      expect((await resumed.commands.run("echo awake")).stdout).toBe("awake\n");
      expect((await resumed.getInfo()).endAt.getTime()).toBeGreaterThan(Date.now() + 500_000);
    } finally {
      await sbx.kill();
    }
  });

  it("pause({keepMemory: false}) on gVisor keeps the files; calls wait for connect; pause() with memory is 501", async () => {
    const sbx = await Sandbox.create("base", { timeoutMs: 600_000 });
    try {
      await sbx.files.write("kept.txt", "files only");
      const withMemory = await sbx.pause().catch((e: unknown) => e);
      expect((withMemory as Error).message).toMatch(/^501: .*keepMemory: false/);
      expect(await sbx.pause({ keepMemory: false })).toBe(true);
      expect(await sbx.pause({ keepMemory: false })).toBe(false);
      expect((await sbx.getInfo()).state).toBe("paused");
      await expect(sbx.commands.run("true")).rejects.toBeInstanceOf(SandboxError);
      expect((await row(sbx.sandboxId)).state).toBe("stopped");
      const resumed = await Sandbox.connect(sbx.sandboxId);
      expect(await resumed.files.read("kept.txt")).toBe("files only");
    } finally {
      await sbx.kill();
    }
  });

  it("a sandbox without onTimeout pause is still deleted at its timeout", async () => {
    const sbx = await Sandbox.create("base", { timeoutMs: 600_000 });
    expect((await sbx.getInfo()).lifecycle).toEqual({ onTimeout: "kill", autoResume: false });
    await expireNow(sbx.sandboxId);
    await pollUntil("deleted at its timeout", async () =>
      ["deleting", "deleted"].includes((await row(sbx.sandboxId)).state),
    );
  });

  describe("bothy's API: on_timeout and auto_wake", () => {
    it("shows the lifecycle, refuses an unknown one, and defaults to delete and auto_wake", async () => {
      const bad = await api(ts.url, "POST", "/sandboxes", { on_timeout: "pause" });
      expect(bad.status).toBe(400);
      expect(bad.json["code"]).toBe("invalid_request");
      const badWake = await api(ts.url, "POST", "/sandboxes", { auto_wake: "yes" });
      expect(badWake.status).toBe(400);
      const made = await api(ts.url, "POST", "/sandboxes", {});
      expect(made.status).toBe(201);
      expect(made.json).toMatchObject({ on_timeout: "delete", auto_wake: true });
      await api(ts.url, "DELETE", `/sandboxes/${String(made.json["sandbox_id"])}`);
    });

    it("auto_wake false: calls are refused with 409 sandbox_asleep; another tenant's key cannot wake it (404); resume does, with a fresh timeout", async () => {
      const made = await api(ts.url, "POST", "/sandboxes", { timeout_s: 600, on_timeout: "sleep", auto_wake: false });
      expect(made.status, JSON.stringify(made.json)).toBe(201);
      expect(made.json).toMatchObject({ on_timeout: "sleep", auto_wake: false });
      const id = String(made.json["sandbox_id"]);
      try {
        expect((await runCommand(ts.wsUrl, id, { cmd: "echo data > /workspace/f && echo ok" })).stdout).toBe("ok\n");
        await expireNow(id);
        await waitAsleep(id);

        const refused = await api(ts.url, "POST", `/sandboxes/${id}/commands`, { cmd: "true" });
        expect(refused.status).toBe(409);
        expect(refused.type).toContain("application/problem+json");
        expect(refused.json).toMatchObject({ code: "sandbox_asleep" });
        expect(String(refused.json["detail"])).toContain(`POST /sandboxes/${id}/resume`);
        const file = await api(ts.url, "GET", `/sandboxes/${id}/files?path=/workspace/f`);
        expect(file.status).toBe(409);
        // Its final deadline cannot be moved on while it sleeps.
        expect((await api(ts.url, "POST", `/sandboxes/${id}/timeout`, { timeout_s: 60 })).status).toBe(409);

        // Tenant b's key: every way to wake it answers as for a sandbox that does not exist.
        const asB = { authorization: `Bearer ${bKey}` };
        expect((await api(ts.url, "POST", `/sandboxes/${id}/resume`, undefined, asB)).status).toBe(404);
        expect((await api(ts.url, "POST", `/sandboxes/${id}/commands`, { cmd: "true" }, asB)).status).toBe(404);
        expect((await api(ts.url, "POST", `/e2b/v2/sandboxes/${id}/connect`, {}, { "x-api-key": bKey })).status).toBe(
          404,
        );
        expect((await row(id)).state).toBe("stopped");

        const woken = await api(ts.url, "POST", `/sandboxes/${id}/resume`);
        expect(woken.status, JSON.stringify(woken.json)).toBe(200);
        expect(woken.json["state"]).toBe("running");
        expect(Date.parse(String(woken.json["expires_at"]))).toBeGreaterThan(Date.now() + 500_000);
        expect((await runCommand(ts.wsUrl, id, { cmd: "cat /workspace/f" })).stdout).toBe("data\n");
      } finally {
        await api(ts.url, "DELETE", `/sandboxes/${id}`);
      }
    });

    it("@bothy/sdk: onTimeout and autoWake; a refused call is a ConflictError sandbox_asleep, resume wakes it", async () => {
      const sbx = await BothySandbox.create({ baseUrl: ts.url, timeoutS: 600, onTimeout: "sleep", autoWake: false });
      try {
        expect(sbx.info).toMatchObject({ on_timeout: "sleep", auto_wake: false });
        await sbx.files.write("/workspace/n", "sdk");
        await expireNow(sbx.sandboxId);
        await waitAsleep(sbx.sandboxId);
        const err = await sbx.commands.run("true").catch((e: unknown) => e);
        expect(err).toBeInstanceOf(ConflictError);
        expect((err as ConflictError).code).toBe("sandbox_asleep");
        expect((await sbx.resume()).state).toBe("running");
        expect(await sbx.files.read("/workspace/n")).toBe("sdk");
      } finally {
        await sbx.kill();
      }
    });

    it("a sandbox asleep after its timeout is deleted at its final deadline", async () => {
      const made = await api(ts.url, "POST", "/sandboxes", { timeout_s: 600, on_timeout: "sleep" });
      const id = String(made.json["sandbox_id"]);
      await expireNow(id);
      await waitAsleep(id);
      await expireNow(id);
      await pollUntil("deleted at its final deadline", async () =>
        ["deleting", "deleted"].includes((await row(id)).state),
      );
    });
  });
});
