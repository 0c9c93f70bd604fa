import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import type { BothyEvent, CommandEvent } from "@bothy/protocol";
import { noLeaks } from "./helpers/host-state.ts";
import { attachCommand, readEventStream, startBackgroundCommand } from "./helpers/background.ts";
import { api, createSandbox, runCommand } from "./helpers/client.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

let ts: TestServer;
let id: string;
let hook: Server;
const hookDeliveries: Array<{ seq: number; type: string; status: number }> = [];
let hookFailNext = 0;

beforeAll(async () => {
  // A webhook receiver on loopback that refuses the first delivery of each event once.
  hook = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      const ev = JSON.parse(body) as BothyEvent;
      const status = hookFailNext-- > 0 ? 500 : 204;
      hookDeliveries.push({ seq: ev.seq, type: ev.type, status });
      res.writeHead(status).end();
    });
  });
  await new Promise<void>((r) => hook.listen(0, "127.0.0.1", r));
  const port = (hook.address() as AddressInfo).port;
  ts = await startTestServer({
    BOTHY_WEBHOOK_URL: `http://127.0.0.1:${port}/hook`,
    BOTHY_WEBHOOK_RETRY_MS: "50",
    BOTHY_COMMAND_REPLAY_BYTES: "2000",
  });
  id = await createSandbox(ts.url);
});

afterAll(async () => {
  expect(await ts.stop()).toEqual(noLeaks());
  await new Promise((r) => hook.close(r));
});

const startBackground = (cmd: string): Promise<string> => startBackgroundCommand(ts.url, id, cmd);
const attach = (commandId: string): Promise<CommandEvent[]> => attachCommand(ts.wsUrl, id, commandId);
const readEvents = (
  query: string,
  until: (events: BothyEvent[]) => boolean,
  headers: Record<string, string> = {},
): Promise<BothyEvent[]> => readEventStream(ts.url, query, until, headers);

describe("background commands", () => {
  it("keep running after the socket closes, are listed, and re-attach with replay then live output", async () => {
    const commandId = await startBackground("for i in 1 2 3; do echo line$i; sleep 1; done; exit 4");
    const listed = await api(ts.url, "GET", `/sandboxes/${id}/commands`);
    expect(listed.json["commands"]).toEqual(
      expect.arrayContaining([expect.objectContaining({ command_id: commandId, state: "running", background: true })]),
    );

    await new Promise((r) => setTimeout(r, 1200));
    const events = await attach(commandId);
    const out = events
      .filter((e) => e.type === "stdout")
      .map((e) => (e as { data: string }).data)
      .join("");
    expect(out).toBe("line1\nline2\nline3\n");
    expect(events.at(-1)).toMatchObject({ type: "process_exited", command_id: commandId, exit_code: 4 });

    const after = await api(ts.url, "GET", `/sandboxes/${id}/commands/${commandId}`);
    expect(after.json).toMatchObject({ command_id: commandId, state: "exited", exit_code: 4, background: true });
    // Attaching again after the end still tells how it ended.
    expect((await attach(commandId)).at(-1)).toMatchObject({ type: "process_exited", exit_code: 4 });
  });

  it("a foreground command dies with its socket", async () => {
    const commandId = await new Promise<string>((resolve) => {
      const ws = new WebSocket(`${ts.wsUrl}/sandboxes/${id}/command`);
      ws.on("open", () => ws.send(JSON.stringify({ cmd: "sleep 30" })));
      ws.on("message", (d) => {
        const ev = JSON.parse(d.toString()) as CommandEvent;
        if (ev.type === "started") {
          ws.terminate();
          resolve(ev.command_id);
        }
      });
    });
    let info: Record<string, unknown> = {};
    for (let i = 0; i < 50 && info["state"] !== "exited"; i++) {
      await new Promise((r) => setTimeout(r, 100));
      info = (await api(ts.url, "GET", `/sandboxes/${id}/commands/${commandId}`)).json;
    }
    expect(info).toMatchObject({ state: "exited", signal: "SIGKILL" });
  });

  it("bounds the replay buffer and says how much was dropped", async () => {
    const commandId = await startBackground("seq 1 5000");
    // since=0: the command may have ended before this subscription starts.
    await readEvents(`?sandbox_id=${id}&since=0`, (evs) =>
      evs.some((e) => e.type === "command.exited" && e.data["command_id"] === commandId),
    );
    const events = await attach(commandId);
    expect(events[0]).toMatchObject({ type: "output_dropped", command_id: commandId });
    expect((events[0] as { bytes: number }).bytes).toBeGreaterThan(20_000);
    const kept = events
      .filter((e) => e.type === "stdout")
      .map((e) => (e as { data: string }).data)
      .join("");
    expect(kept.length).toBeLessThanOrEqual(2000);
    expect(kept.endsWith("4999\n5000\n")).toBe(true);
    expect(events.at(-1)).toMatchObject({ type: "process_exited", exit_code: 0 });
  });

  it("refuses to re-attach to an unknown command", async () => {
    const res = await api(ts.url, "GET", `/sandboxes/${id}/commands/cmd_aaaaaaaaaaaaaaaaaaaa`);
    expect(res.status).toBe(404);
    expect(res.json["code"]).toBe("command_not_found");
  });
});

describe("completion events", () => {
  it("streams command.exited on GET /events, filtered by sandbox", async () => {
    const other = await createSandbox(ts.url);
    // Resume from the newest event so far: nothing is missed however long the subscription takes.
    const last = (await ts.server.events.since(0, id)).at(-1)?.seq ?? 0;
    const seen = readEvents(`?sandbox_id=${id}&since=${last}`, (evs) => evs.some((e) => e.type === "command.exited"));
    await runCommand(ts.wsUrl, other, { cmd: "exit 9" });
    const r = await runCommand(ts.wsUrl, id, { cmd: "exit 3" });
    const events = await seen;
    expect(events.every((e) => e.sandbox_id === id)).toBe(true);
    expect(events.find((e) => e.type === "command.exited")?.data).toMatchObject({
      command_id: r.exit?.command_id,
      exit_code: 3,
      state: "exited",
    });
    await api(ts.url, "DELETE", `/sandboxes/${other}`);
  });

  it("replays what a client missed from its Last-Event-ID", async () => {
    const all = await readEvents(`?sandbox_id=${id}&since=0`, (evs) => evs.some((e) => e.type === "command.exited"));
    expect(all[0]).toMatchObject({ type: "sandbox.created", sandbox_id: id });
    const first = all[0]?.seq ?? 0;
    const rest = await readEvents(`?sandbox_id=${id}`, (evs) => evs.length > 0, { "last-event-id": String(first) });
    expect(rest[0]?.seq).toBeGreaterThan(first);
  });

  it("POSTs events to the webhook and retries a failed delivery", async () => {
    hookFailNext = 1;
    const r = await runCommand(ts.wsUrl, id, { cmd: "exit 5" });
    let tries: typeof hookDeliveries = [];
    for (let i = 0; i < 100; i++) {
      const exited = hookDeliveries.filter((d) => d.type === "command.exited");
      const seq = exited.at(-1)?.seq;
      tries = exited.filter((d) => d.seq === seq);
      if (tries.some((d) => d.status === 204)) break;
      await new Promise((res) => setTimeout(res, 50));
    }
    expect(tries.map((d) => d.status)).toEqual([500, 204]);
    const events = (await ts.server.events.since(0, id)).filter((e) => e.type === "command.exited");
    expect(events.at(-1)?.data["command_id"]).toBe(r.exit?.command_id);
  });
});
