/**
 * `GET /events` from the side of a tenant that wants to exhaust the server (no sandboxes: the rows
 * are made through the server's own bus and ledger, as its parts make them): a replay from 0
 * reads only the tenant's own rows, a page at a time; a client that stops reading holds the
 * server to a bounded buffer and still gets every event once it reads again; the sweeper prunes
 * the table to its retention. What the server holds and read is taken from its own /metrics.
 */
import { connect, type Socket } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pollUntil } from "./helpers/client.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

/** The metrics' value of one series (its full name with labels, as exposed). */
async function metric(ts: TestServer, series: string): Promise<number> {
  const text = await (await fetch(`${ts.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  if (line === undefined) throw new Error(`no ${series} in /metrics`);
  return Number(line.slice(series.length + 1));
}

async function mintKey(ts: TestServer, tenant: string): Promise<string> {
  const created = await fetch(`${ts.url}/tenants`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ tenant }),
  });
  expect(created.status).toBe(201);
  const res = await fetch(`${ts.url}/keys`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ tenant, name: tenant }),
  });
  expect(res.status).toBe(201);
  return String(((await res.json()) as { key: string }).key);
}

interface Received {
  seq: number;
  type: string;
  data: Record<string, unknown>;
}

/** An SSE parser over a raw socket: every event's data, in order. */
class SseReader {
  readonly events: Received[] = [];
  private buffer = "";
  private headersDone = false;

  constructor(readonly socket: Socket) {
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => this.take(chunk));
  }

  private take(chunk: string): void {
    this.buffer += chunk;
    if (!this.headersDone) {
      const end = this.buffer.indexOf("\r\n\r\n");
      if (end < 0) return;
      this.buffer = this.buffer.slice(end + 4);
      this.headersDone = true;
    }
    for (let i = this.buffer.indexOf("\n\n"); i >= 0; i = this.buffer.indexOf("\n\n")) {
      const block = this.buffer.slice(0, i);
      this.buffer = this.buffer.slice(i + 2);
      const data = block.split("\n").find((l) => l.startsWith("data: "));
      if (data) this.events.push(JSON.parse(data.slice(6)) as Received);
    }
  }
}

/** `GET /events` on a socket of its own (so the test decides when it reads), headers answered. */
async function openStream(ts: TestServer, key: string, query: string): Promise<SseReader> {
  const { port } = new URL(ts.url);
  const socket = connect({ host: "127.0.0.1", port: Number(port) });
  await new Promise<void>((resolve, reject) => socket.once("connect", resolve).once("error", reject));
  const reader = new SseReader(socket);
  socket.write(`GET /events${query} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${key}\r\n\r\n`);
  await pollUntil("the event stream's headers", () => (reader as unknown as { headersDone: boolean }).headersDone);
  return reader;
}

describe("event streams under abuse", () => {
  let ts: TestServer;
  let alpha: string;
  const open: Socket[] = [];

  beforeAll(async () => {
    // Retention by count, small enough for the prune test below; the sweeper runs every second.
    ts = await startTestServer({ BOTHY_EVENTS_RETENTION: "7d,40000", BOTHY_SWEEP_INTERVAL_S: "1" });
    alpha = await mintKey(ts, "alpha");
    await mintKey(ts, "beta");
  });

  afterAll(async () => {
    for (const socket of open) socket.destroy();
    await ts?.stop();
  });

  it("a replay from 0 reads the tenant's own rows only, in pages, then goes live", async () => {
    // Another tenant's busy history: 16 of its rows for each of alpha's.
    const ALPHA_ROWS = 1250;
    for (let i = 0; i < ALPHA_ROWS * 16; i++) {
      await ts.server.events.publish("sandbox.created", null, { who: "beta", i }, "beta");
      if (i % 16 === 15)
        await ts.server.events.publish("sandbox.created", null, { who: "alpha", i: (i - 15) / 16 }, "alpha");
    }
    const before = await metric(ts, "bothy_event_replay_rows_total");
    const reader = await openStream(ts, alpha, "?since=0");
    open.push(reader.socket);
    await pollUntil("alpha's whole history", () => reader.events.length >= ALPHA_ROWS);
    expect(reader.events.map((e) => e.data["who"])).toEqual(new Array(ALPHA_ROWS).fill("alpha"));
    expect(reader.events.map((e) => e.data["i"])).toEqual([...Array(ALPHA_ROWS).keys()]);
    // The ledger gave the replay alpha's rows and nothing of beta's 20000.
    expect((await metric(ts, "bothy_event_replay_rows_total")) - before).toBe(ALPHA_ROWS);

    await ts.server.events.publish("sandbox.deleted", null, { who: "alpha", live: true }, "alpha");
    await ts.server.events.publish("sandbox.deleted", null, { who: "beta", live: true }, "beta");
    await ts.server.events.publish("sandbox.deleted", null, { who: "alpha", live: true, last: true }, "alpha");
    await pollUntil("the live events", () => reader.events.some((e) => e.data["last"] === true));
    expect(reader.events.slice(ALPHA_ROWS).map((e) => e.data["who"])).toEqual(["alpha", "alpha"]);
  });

  it("a replay of another tenant's sandbox reads nothing", async () => {
    const beta = "sbx_bbbbbbbbbbbbbbbbbbbb";
    for (let i = 0; i < 2000; i++) await ts.server.events.publish("sandbox.created", beta, { who: "beta" }, "beta");
    const before = await metric(ts, "bothy_event_replay_rows_total");
    const reader = await openStream(ts, alpha, `?since=0&sandbox_id=${beta}`);
    open.push(reader.socket);
    await ts.server.events.publish("sandbox.deleted", beta, { who: "beta", last: true }, "beta");
    // Every stream live again: this one's replay is over, and it read no row.
    await pollUntil(
      "every stream to be live",
      async () => (await metric(ts, 'bothy_event_streams{state="replaying"}')) === 0,
    );
    expect(reader.events).toEqual([]);
    expect((await metric(ts, "bothy_event_replay_rows_total")) - before).toBe(0);
    reader.socket.destroy();
  });

  it("a client that stops reading holds the server to a bounded buffer, and gets every event once it reads", async () => {
    const reader = await openStream(ts, alpha, "");
    open.push(reader.socket);
    reader.socket.pause();
    const TOTAL = 3000;
    const pad = "x".repeat(8 * 1024);
    const first = (await ts.server.events.publish("sandbox.created", null, { who: "alpha", n: 0, pad }, "alpha")).seq;
    for (let n = 1; n < TOTAL; n++)
      await ts.server.events.publish("sandbox.created", null, { who: "alpha", n, pad }, "alpha");
    // 24 MB went to a client that reads nothing: the stream waits for it, holding a bounded buffer.
    await pollUntil("the stream to wait for its client", async () => {
      return (await metric(ts, 'bothy_event_streams{state="behind"}')) === 1;
    });
    const held = await metric(ts, "bothy_event_stream_buffered_bytes");
    expect(held).toBeLessThan(256 * 1024);

    reader.socket.resume();
    await pollUntil("every event", () => reader.events.length >= TOTAL, 60_000);
    expect(reader.events.map((e) => e.data["n"])).toEqual([...Array(TOTAL).keys()]);
    expect(reader.events[0]?.seq).toBe(first);
    await pollUntil("the stream to be live again", async () => {
      return (await metric(ts, 'bothy_event_streams{state="behind"}')) === 0;
    });
  });

  it("the sweeper prunes the table to its retention", async () => {
    // 40000 rows kept; the tests above wrote ~27000 and this one 20000 more.
    for (let i = 0; i < 20_000; i++)
      await ts.server.events.publish("sandbox.created", null, { who: "beta", i }, "beta");
    const last = await ts.server.ledger.events.lastSeq();
    await pollUntil(
      "the sweeper's prune",
      async () => (await ts.server.ledger.eventsSince(0, undefined, 1))[0]?.seq === last - 39_999,
    );
    const reader = await openStream(ts, alpha, "?since=0");
    open.push(reader.socket);
    await ts.server.events.publish("sandbox.deleted", null, { who: "alpha", last: true }, "alpha");
    await pollUntil("the replay and the live event", () => reader.events.some((e) => e.data["last"] === true));
    // alpha's oldest rows are gone: its replay starts after them.
    expect(reader.events[0]?.seq).toBeGreaterThanOrEqual(last - 39_999);
  });
});
