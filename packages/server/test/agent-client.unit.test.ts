import { PassThrough } from "node:stream";
import { afterEach, describe, expect, it } from "vitest";
import {
  BothyError,
  encodeFrame,
  FrameDecoder,
  PROTOCOL_GENERATION,
  type GuestFrame,
  type HostFrame,
} from "@bothy/protocol";
import { AgentClient } from "../src/agent/agent-client.ts";

/**
 * A guest on the other end of a pipe that answers only what a test tells it to: the client's
 * deadlines are tested against a guest that never answers, without a sandbox.
 */
class FakeGuest {
  readonly toHost = new PassThrough();
  readonly fromHost = new PassThrough();
  readonly received: HostFrame[] = [];
  private readonly decoder = new FrameDecoder();

  constructor(private readonly answer: (frame: HostFrame, guest: FakeGuest) => void) {
    this.fromHost.on("data", (chunk: Buffer) => {
      for (const raw of this.decoder.push(chunk)) {
        const frame = raw.header as HostFrame;
        this.received.push(frame);
        this.answer(frame, this);
      }
    });
  }

  send(frame: GuestFrame, payload?: Buffer): void {
    this.toHost.write(encodeFrame(frame, payload));
  }
}

const clients: AgentClient[] = [];

async function connect(answer: (frame: HostFrame, guest: FakeGuest) => void): Promise<[AgentClient, FakeGuest]> {
  const guest = new FakeGuest(answer);
  const client = new AgentClient(guest.toHost, guest.fromHost, { fileTimeoutMs: 50 });
  clients.push(client);
  guest.send({ t: "hello", gen: PROTOCOL_GENERATION, agent: "fake", pid: 1 });
  await client.handshake(5_000);
  return [client, guest];
}

/** Answers stat of "/ok" at once and nothing else. */
function onlyStat(frame: HostFrame, guest: FakeGuest): void {
  if (frame.t === "stat" && frame.path === "/ok")
    guest.send({ t: "stat_result", id: frame.id, stat: { type: "file", size: 1, mode: 0o644, mtime_ms: 0 } });
}

afterEach(() => {
  for (const c of clients.splice(0)) c.close(new BothyError("agent_unavailable", "Test over."));
});

describe("agent client deadlines", () => {
  it("fails a file request the guest never answers with agent_timeout, cancels it, and carries on", async () => {
    const [client, guest] = await connect(onlyStat);
    for (const call of [
      () => client.mkdir("/workspace/rootlink/tmp/x", true),
      () => client.stat("/silent"),
      () => client.list("/silent"),
      () => client.remove("/silent", true),
      () => client.rename("/a", "/b"),
      () => client.openRead("/silent"),
      () => client.writeFile("/silent", Buffer.from("x")),
    ]) {
      await expect(call()).rejects.toMatchObject({ code: "agent_timeout" });
    }
    const cancelled = guest.received.filter((f) => f.t === "cancel").length;
    expect(cancelled).toBeGreaterThanOrEqual(7);
    expect(client.isClosed).toBe(false);
    expect(await client.stat("/ok")).toMatchObject({ type: "file", size: 1 });
  });

  it("fails a read whose guest stops sending while the reader waits", async () => {
    const [client] = await connect((frame, guest) => {
      onlyStat(frame, guest);
      if (frame.t !== "file_read") return;
      guest.send({ t: "stat_result", id: frame.id, stat: { type: "file", size: 10, mode: 0o644, mtime_ms: 0 } });
      guest.send({ t: "file_chunk", id: frame.id }, Buffer.from("abcd"));
    });
    const { stat, stream } = await client.openRead("/stalls");
    expect(stat.size).toBe(10);
    const got: Buffer[] = [];
    await expect(
      (async () => {
        for await (const chunk of stream) got.push(chunk as Buffer);
      })(),
    ).rejects.toMatchObject({ code: "agent_timeout" });
    expect(Buffer.concat(got).toString()).toBe("abcd");
    expect(await client.stat("/ok")).toMatchObject({ size: 1 });
  });

  it("fails a read that ends short of the opened file's size", async () => {
    const [client] = await connect((frame, guest) => {
      if (frame.t !== "file_read") return;
      guest.send({ t: "stat_result", id: frame.id, stat: { type: "file", size: 10, mode: 0o644, mtime_ms: 0 } });
      guest.send({ t: "file_chunk", id: frame.id }, Buffer.from("abcd"));
      guest.send({ t: "file_done", id: frame.id, size: 4, sha256: "0".repeat(64) });
    });
    const { stream } = await client.openRead("/shrinks");
    await expect(
      (async () => {
        for await (const _chunk of stream);
      })(),
    ).rejects.toMatchObject({ code: "file_error" });
  });

  it("ends a read at the opened file's size", async () => {
    const [client] = await connect((frame, guest) => {
      if (frame.t !== "file_read") return;
      guest.send({ t: "stat_result", id: frame.id, stat: { type: "file", size: 3, mode: 0o644, mtime_ms: 0 } });
      guest.send({ t: "file_chunk", id: frame.id }, Buffer.from("abcdef"));
    });
    const { stream } = await client.openRead("/grows");
    const got: Buffer[] = [];
    for await (const chunk of stream) got.push(chunk as Buffer);
    expect(Buffer.concat(got).toString()).toBe("abc");
  });
});
