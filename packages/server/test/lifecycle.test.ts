import { mkdir, readdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import type { CommandEvent } from "@bothy/protocol";
import type { SandboxCreateOptions } from "@bothy/sdk";
import { abandonableCommand, api, createSandbox, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { noLeaks } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";
import type { ServerEventName } from "../src/events/server-events.ts";

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Polls until `check` returns true; fails with `what` after `timeoutMs`. */
async function until(what: string, timeoutMs: number, check: () => Promise<boolean> | boolean): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await sleep(250);
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
}

/** Opens a command socket and resolves once the command has started. */
function startCommand(wsBase: string, id: string, cmd: string): Promise<WebSocket> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${wsBase}/sandboxes/${id}/command`);
    ws.on("open", () => ws.send(JSON.stringify({ cmd })));
    ws.on("message", (data) => {
      if ((JSON.parse(data.toString()) as CommandEvent).type === "started") resolve(ws);
    });
    ws.on("unexpected-response", (_req, res) => reject(new Error(`upgrade refused: ${res.statusCode}`)));
    ws.on("error", reject);
  });
}

/** PIDs of host processes (runsc or qemu) whose command line names the sandbox. */
async function sandboxPids(id: string): Promise<number[]> {
  const pids: number[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const argv = await readFile(`/proc/${entry}/cmdline`, "utf8").catch(() => "");
    if (argv.includes(id) && /runsc|qemu-system/.test(argv)) pids.push(Number(entry));
  }
  return pids;
}

// Every host object a sandbox can have lives under its directory or names its id in a process.
async function hostHas(ts: TestServer, id: string): Promise<boolean> {
  const dirs = await readdir(join(ts.home, "sandboxes")).catch(() => [] as string[]);
  return dirs.includes(id) || (await sandboxPids(id)).length > 0;
}

const drivers = testDrivers();
for (const driver of drivers) {
  /**
   * What the manager decides alone (a timeout moved, a client's connections counted) is the same
   * on every driver: tested on the run's first driver only. What the driver's processes make
   * (expiry leaving nothing on the host, a killed sandbox back from its disk) is tested on each.
   */
  const first = driver.name === drivers[0]?.name;
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "lifecycle"), () => {
    let ts: TestServer;
    const made: string[] = [];
    const state = async (id: string): Promise<unknown> => (await api(ts.url, "GET", `/sandboxes/${id}`)).json["state"];
    // The server's typed events, as every subscriber sees them.
    const logHas = (event: ServerEventName, id: string): boolean =>
      ts.events.some((e) => e.event === event && "sandbox_id" in e && e.sandbox_id === id);
    const create = async (body: SandboxCreateOptions): Promise<string> => {
      const id = await createSandbox(ts.url, { template: "seed", ...body });
      made.push(id);
      return id;
    };

    beforeAll(async () => {
      ts = await startTestServer({ BOTHY_DRIVER: driver.name, BOTHY_SWEEP_INTERVAL_S: "1" });
    });

    afterAll(async () => {
      if (!ts) return;
      for (const id of made) await api(ts.url, "DELETE", `/sandboxes/${id}`).catch(() => undefined);
      expect(await ts.stop()).toEqual(noLeaks());
    });

    describe("timeouts", () => {
      it("refuses timeouts out of range with 400 invalid_request and the range", async () => {
        for (const timeout_s of [0, -5, 86401]) {
          const res = await api(ts.url, "POST", "/sandboxes", { timeout_s });
          expect(res.status).toBe(400);
          expect(res.json).toMatchObject({
            code: "invalid_request",
            detail: expect.stringMatching(/timeout_s must be between 1 and 86400 seconds/),
          });
        }
        for (const body of [
          { timeout_s: 1.5 },
          { timeout_s: "60" },
          { disconnect_grace_s: 7200 },
          { delete_on_disconnect: "yes" },
        ]) {
          const res = await api(ts.url, "POST", "/sandboxes", body);
          expect(res.status, JSON.stringify(body)).toBe(400);
          expect(res.json["code"]).toBe("invalid_request");
        }
        const missing = await api(ts.url, "POST", "/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa/timeout", { timeout_s: 60 });
        expect(missing.status).toBe(404);
      });

      it("shows expires_at, and the sweeper deletes an expired sandbox leaving nothing on the host", async () => {
        const t0 = Date.now();
        const id = await create({ timeoutS: 3 });
        const info = (await api(ts.url, "GET", `/sandboxes/${id}`)).json;
        expect(info).toMatchObject({ delete_on_disconnect: false, expires_at: expect.any(String) });
        const expires = Date.parse(info["expires_at"] as string);
        expect(expires).toBeGreaterThanOrEqual(t0 + 2000);
        expect(expires).toBeLessThanOrEqual(Date.now() + 3000);
        await until(`${id} to be deleted`, 20_000, async () => (await state(id)) === "deleted");
        await until(`${id}'s host objects to go`, 10_000, async () => !(await hostHas(ts, id)));
        expect(await logHas("sandbox_expired", id)).toBe(true);
      });

      if (first)
        it("POST /timeout extends a sandbox's life from now, and shortens it", async () => {
          const id = await create({ timeoutS: 3 });
          const res = await api(ts.url, "POST", `/sandboxes/${id}/timeout`, { timeout_s: 60 });
          expect(res.status).toBe(200);
          expect(Date.parse(res.json["expires_at"] as string)).toBeGreaterThan(Date.now() + 50_000);
          await sleep(6000);
          expect(await state(id)).toBe("running");
          expect((await runCommand(ts.wsUrl, id, { cmd: "echo alive" })).stdout).toBe("alive\n");

          const bad = await api(ts.url, "POST", `/sandboxes/${id}/timeout`, { timeout_s: 999_999 });
          expect(bad.status).toBe(400);
          expect(bad.json["detail"]).toMatch(/timeout_s must be between 1 and 86400/);
          expect((await api(ts.url, "POST", `/sandboxes/${id}/timeout`, {})).status).toBe(400);

          expect((await api(ts.url, "POST", `/sandboxes/${id}/timeout`, { timeout_s: 1 })).status).toBe(200);
          await until(`${id} to be deleted`, 15_000, async () => (await state(id)) === "deleted");
          const gone = await api(ts.url, "POST", `/sandboxes/${id}/timeout`, { timeout_s: 60 });
          expect(gone.status).toBe(409);
          expect(gone.json["code"]).toBe("sandbox_not_running");
        });
    });

    if (first)
      describe("delete_on_disconnect", () => {
        let id: string;

        beforeAll(async () => {
          id = await create({ deleteOnDisconnect: true, disconnectGraceS: 2 });
        });

        it("is shown on the sandbox", async () => {
          expect((await api(ts.url, "GET", `/sandboxes/${id}`)).json).toMatchObject({ delete_on_disconnect: true });
        });

        it("keeps the sandbox after commands end and after a clean close", async () => {
          expect((await runCommand(ts.wsUrl, id, { cmd: "true" })).closeCode).toBe(1000);
          const ws = await startCommand(ts.wsUrl, id, "sleep 30");
          ws.close(1000);
          await sleep(4000);
          expect(await state(id)).toBe("running");
          expect(await logHas("disconnect_grace_started", id)).toBe(false);
        });

        it("keeps the sandbox when the client reconnects within the grace", async () => {
          const dropped = await startCommand(ts.wsUrl, id, "sleep 30");
          dropped.terminate();
          await until("the grace period to start", 5000, () => logHas("disconnect_grace_started", id));
          const back = await startCommand(ts.wsUrl, id, "sleep 30");
          expect(await logHas("disconnect_grace_cancelled", id)).toBe(true);
          await sleep(4000);
          expect(await state(id)).toBe("running");
          back.close(1000);
        });

        it("counts a command over HTTP as the client's connection: answered is clean, abandoned starts the grace", async () => {
          const graces = (): number =>
            ts.events.filter((e) => e.event === "disconnect_grace_started" && e.sandbox_id === id).length;
          const before = graces();
          const answered = await api(ts.url, "POST", `/sandboxes/${id}/commands`, { cmd: "true" });
          expect(answered.json).toMatchObject({ exit_code: 0 });
          const abandoned = abandonableCommand(ts.url, id, "sleep 31");
          await until("the command to start", 30_000, async () => {
            const list = (await api(ts.url, "GET", `/sandboxes/${id}/commands`)).json["commands"];
            return (list as Array<{ cmd: string; state: string }>).some(
              (c) => c.cmd === "sleep 31" && c.state === "running",
            );
          });
          abandoned.abort();
          expect(await abandoned.settled).toBeInstanceOf(Error);
          // The answered request's end came first and started nothing; the abandoned one did.
          await until("the grace period to start", 5000, () => graces() > before);
          expect(graces()).toBe(before + 1);
          const back = await startCommand(ts.wsUrl, id, "sleep 30");
          expect(await logHas("disconnect_grace_cancelled", id)).toBe(true);
          expect(await state(id)).toBe("running");
          back.close(1000);
        });

        it("deletes the sandbox once its last socket drops and the grace passes", async () => {
          const ws = await startCommand(ts.wsUrl, id, "sleep 30");
          const dropped = Date.now();
          ws.terminate();
          await until(`${id} to be deleted`, 15_000, async () => (await state(id)) === "deleted");
          expect(Date.now() - dropped).toBeGreaterThanOrEqual(1500);
          await until(`${id}'s host objects to go`, 10_000, async () => !(await hostHas(ts, id)));
        });
      });

    describe("sweeper", () => {
      it("removes a host object no sandbox owns, and logs it", async () => {
        const orphan = "sbx_orphanorphanorphan22";
        const dir = join(ts.home, "sandboxes", orphan);
        await mkdir(join(dir, "upper"), { recursive: true });
        await writeFile(join(dir, "vm.json"), "{}");
        await until(`${orphan} to be removed`, 15_000, async () => !(await hostHas(ts, orphan)));
        expect(await logHas("orphan_removed", orphan)).toBe(true);
      });

      it(
        "brings a sandbox whose process was killed back from its disk, with the same id",
        { timeout: 180_000 },
        async () => {
          const id = await create({});
          // A VM killed outright loses what its guest had not yet written to disk, as a machine losing power does.
          expect(
            (await runCommand(ts.wsUrl, id, { cmd: "echo survived > /workspace/note && sync" })).exit?.exit_code,
          ).toBe(0);
          const pids = await sandboxPids(id);
          expect(pids.length).toBeGreaterThan(0);
          for (const pid of pids) process.kill(pid, "SIGKILL");
          await until(`${id} to be stopped`, 15_000, async () => (await state(id)) === "stopped");
          expect((await api(ts.url, "GET", `/sandboxes/${id}`)).json["error"]).toMatch(
            /stopped unexpectedly.*files are kept/,
          );
          expect(await logHas("sandbox_died", id)).toBe(true);
          await until(`${id}'s processes to go`, 15_000, async () => (await sandboxPids(id)).length === 0);

          const back = await runCommand(ts.wsUrl, id, { cmd: "cat /workspace/note" });
          expect(back.stdout).toBe("survived\n");
          expect(await state(id)).toBe("running");
          expect(await logHas("sandbox_woken", id)).toBe(true);
        },
      );
    });

    it("serves Prometheus metrics", async () => {
      const res = await fetch(`${ts.url}/metrics`);
      expect(res.status).toBe(200);
      expect(res.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);
      const text = await res.text();
      for (const name of [
        "bothy_sandboxes",
        "bothy_sandbox_create_seconds_bucket",
        "bothy_commands_started_total",
        "bothy_commands_exited_total",
        "bothy_errors_total",
        "bothy_sweeper_removals_total",
      ]) {
        expect(text).toMatch(new RegExp(`^${name}[{ ]`, "m"));
      }
      expect(text).toMatch(new RegExp(`^bothy_sandboxes\\{state="deleted",driver="${driver.name}"\\} [1-9]`, "m"));
      expect(text).toMatch(/^bothy_errors_total\{code="invalid_request"\} [1-9]/m);
      expect(text).toMatch(/^bothy_sweeper_removals_total\{reason="expired"\} [1-9]/m);
      expect(text).toMatch(/^bothy_sweeper_removals_total\{reason="orphan"\} [1-9]/m);
      if (first) expect(text).toMatch(/^bothy_sandboxes_deleted_total\{reason="disconnected"\} [1-9]/m);
    });
  });
}
