/**
 * The real `bothy serve` on PostgreSQL (BOTHY_DATABASE_URL) with real gVisor sandboxes: what the
 * SQLite suites check of the API, on the other LedgerStore, one shared sandbox through the file. A
 * create raced with one Idempotency-Key, a command, a file round trip, pause and resume, events
 * replayed from a Last-Event-ID without a gap, a `kill -9` of the server and a restart on the same
 * database that takes the sandbox back, and a delete that leaves nothing on the host or in the rows.
 * The driver does not matter here (the store does): gVisor only.
 */
import { mkdtemp, rm } from "node:fs/promises";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { BothyEvent } from "@bothy/protocol";
import { readEventStream } from "./helpers/background.ts";
import { api, deleteSandbox, pollUntil, runCommand, waitDeleted } from "./helpers/client.ts";
import { driverTitle, testDriver } from "./helpers/drivers.ts";
import { hostLeaks, noLeaks } from "./helpers/host-state.ts";
import { startPostgres, type TestPostgres } from "./helpers/postgres.ts";
import { spawnTestServe, type ServeProcess } from "./helpers/serve-process.ts";

const driver = testDriver("gvisor");
/** What the event checks wait for, per kind of event. */
const isType = (type: string) => (e: BothyEvent) => e.type === type;

describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "bothy serve on PostgreSQL"), () => {
  let postgres: TestPostgres | undefined;
  let databaseUrl = "";
  let home = "";
  let serve: ServeProcess | undefined;
  let base = "";
  let id = "";
  const ws = (): string => base.replace(/^http/, "ws");

  /** The server on this home and database; the shortest node lease, so a restart after a kill waits little. */
  async function start(): Promise<void> {
    serve = spawnTestServe(home, {
      BOTHY_DRIVER: "gvisor",
      BOTHY_DATABASE_URL: databaseUrl,
      BOTHY_NODE_URL: "http://127.0.0.1:1",
      BOTHY_NODE_LEASE_S: "3",
    });
    base = await serve.url;
  }

  /** The ledger's rows of sandboxes, read from PostgreSQL itself. */
  async function rows(): Promise<Map<string, string>> {
    const client = new pg.Client({ connectionString: databaseUrl });
    await client.connect();
    try {
      const res = await client.query<{ id: string; state: string }>("SELECT id, state FROM sandboxes");
      return new Map(res.rows.map((r) => [r.id, r.state]));
    } finally {
      await client.end();
    }
  }

  const events = (query: string, until: (evs: BothyEvent[]) => boolean, headers?: Record<string, string>) =>
    readEventStream(base, query, until, headers);

  /** Runs a command, then answers the sandbox's events from the first through that command's exit. */
  async function eventsThroughCommand(): Promise<BothyEvent[]> {
    const r = await runCommand(ws(), id, { cmd: "true" });
    const commandId = r.exit?.command_id;
    expect(commandId).toBeDefined();
    return events(`?sandbox_id=${id}&since=0`, (evs) =>
      evs.some((e) => e.type === "command.exited" && e.data["command_id"] === commandId),
    );
  }

  beforeAll(async () => {
    postgres = await startPostgres();
    databaseUrl = await postgres.createDatabase("bothy_server");
    home = await mkdtemp("/tmp/bothy-test-pgserver-");
    await start();
  }, 120_000);

  afterAll(async () => {
    await serve?.stop();
    if (home) await rm(home, { recursive: true, force: true });
    await postgres?.stop();
  });

  it("a create sent twice at once with one Idempotency-Key makes one sandbox", { timeout: 60_000 }, async () => {
    const body = { template: "seed", vcpu: 1, memory_mib: 512 };
    const headers = { "idempotency-key": "pg-race-1" };
    const results = await Promise.all([1, 2].map(() => api(base, "POST", "/sandboxes", body, headers)));
    expect(results.map((r) => r.status).sort()).toEqual([200, 201]);
    const ids = new Set(results.map((r) => r.json["sandbox_id"]));
    expect(ids.size).toBe(1);
    id = String([...ids][0]);
    expect([...(await rows()).keys()]).toEqual([id]);
  });

  it("runs a command and round-trips a file", { timeout: 60_000 }, async () => {
    const r = await runCommand(ws(), id, { cmd: "echo hello from postgres" });
    expect(r.stdout).toBe("hello from postgres\n");
    expect(r.exit?.exit_code).toBe(0);

    const content = "bytes\x00and text\n".repeat(100);
    const put = await fetch(`${base}/sandboxes/${id}/files?path=${encodeURIComponent("/workspace/pg.bin")}`, {
      method: "PUT",
      headers: { "content-type": "application/octet-stream" },
      body: content,
    });
    expect(put.status).toBe(200);
    const got = await fetch(`${base}/sandboxes/${id}/files?path=${encodeURIComponent("/workspace/pg.bin")}`);
    expect(got.status).toBe(200);
    expect(await got.text()).toBe(content);
  });

  it("pauses with its files and resumes", { timeout: 90_000 }, async () => {
    // gVisor keeps no memory: the native pause says so, and E2B's pause({keepMemory: false}) stops it with its disk.
    const refused = await api(base, "POST", `/sandboxes/${id}/pause`);
    expect([refused.status, refused.json["code"]]).toEqual([501, "not_supported"]);
    expect((await api(base, "POST", `/e2b/sandboxes/${id}/pause`, { memory: false })).status).toBe(204);
    const asleep = (await rows()).get(id);
    expect(asleep === "paused" || asleep === "stopped").toBe(true);
    expect((await api(base, "GET", `/sandboxes/${id}`)).json["state"]).toBe(asleep);
    const resumed = await api(base, "POST", `/sandboxes/${id}/resume`);
    expect([resumed.status, resumed.json["state"]]).toEqual([200, "running"]);
    expect((await rows()).get(id)).toBe("running");
    expect((await runCommand(ws(), id, { cmd: "wc -c < /workspace/pg.bin" })).stdout).toBe("1500\n");
  });

  it("replays events from a Last-Event-ID with no gap and none twice", { timeout: 60_000 }, async () => {
    const all = await eventsThroughCommand();
    expect(all[0]).toMatchObject({ type: "sandbox.created", sandbox_id: id });
    // A pause is no public event (on either store); the resume's wake is.
    expect(all.map((e) => e.type)).toContain("sandbox.woken");
    const seqs = all.map((e) => e.seq);
    expect(seqs).toEqual([...seqs].sort((a, b) => a - b));
    // From every point of the stream, the replay is exactly what followed it.
    for (const [i, from] of all.slice(0, -1).entries()) {
      const want = all.slice(i + 1);
      const rest = await events(`?sandbox_id=${id}`, (evs) => evs.length >= want.length, {
        "last-event-id": String(from.seq),
      });
      expect(rest).toEqual(want);
    }
  });

  it(
    "after a kill -9, a restart on the same database takes the sandbox back and settles a create cut short",
    { timeout: 120_000 },
    async () => {
      const lastSeq = (await eventsThroughCommand()).at(-1)?.seq ?? 0;
      // A second create under way when the server dies: its row exists, its sandbox may be half-made.
      const cut = api(base, "POST", "/sandboxes", { template: "seed", vcpu: 1, memory_mib: 512 }).catch(
        (err: unknown) => err,
      );
      let other = "";
      await pollUntil("the second create's row", async () => {
        other = [...(await rows()).keys()].find((k) => k !== id) ?? "";
        return other !== "";
      });
      await serve?.kill();
      await cut;
      await start();

      const states = await rows();
      expect(states.get(id)).toBe("running");
      // Nothing half-made: the cut create is running (it had finished) or ended, never left creating.
      expect([...states.values()].filter((s) => s === "creating" || s === "deleting")).toEqual([]);
      expect(["running", "failed"]).toContain(states.get(other));
      await serve?.logged("sandbox_reattached");
      expect((await runCommand(ws(), id, { cmd: "cat /workspace/pg.bin | wc -c" })).stdout).toBe("1500\n");
      // The database's events go on after the restart: a client that held the last id before the kill gets what followed.
      const after = await events(`?sandbox_id=${id}`, (evs) => evs.some(isType("command.exited")), {
        "last-event-id": String(lastSeq),
      });
      expect(after[0]?.seq).toBeGreaterThan(lastSeq);
      // On the host only running sandboxes' own processes, mounts, cgroups and directories.
      const running = [...states].filter(([, s]) => s === "running").map(([k]) => k);
      const leaks = await hostLeaks(home);
      const others = (lines: string[]): string[] => lines.filter((l) => !running.some((k) => l.includes(k)));
      expect({
        runscProcesses: others(leaks.runscProcesses),
        runscContainers: others(leaks.runscContainers),
        mounts: others(leaks.mounts),
        sandboxDirs: others(leaks.sandboxDirs),
        cgroups: others(leaks.cgroups),
      }).toEqual({ runscProcesses: [], runscContainers: [], mounts: [], sandboxDirs: [], cgroups: [] });
      if (states.get(other) === "running") expect(await deleteSandbox(base, other)).toBe("deleted");
    },
  );

  it("deletes the sandbox: nothing of it is left on the host or live in the rows", { timeout: 60_000 }, async () => {
    expect((await api(base, "DELETE", `/sandboxes/${id}`)).status).toBe(200);
    expect(await waitDeleted(base, id)).toBe("deleted");
    await pollUntil("the delete's row", async () => (await rows()).get(id) === "deleted");
    await serve?.stop();
    expect(await hostLeaks(home)).toEqual(noLeaks());
  });
});
