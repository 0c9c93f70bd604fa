/**
 * A WebSocket whose binary messages are the bytes of one TCP connection inside a sandbox (over the
 * guest channel, or a socket to the sandbox's address: port-dialer.ts): bothy's own websockify.
 * Serves the desktop's VNC stream and `/tunnel/{port}` (what `bothy port --forward` connects to).
 */
import type { Duplex } from "node:stream";
import type { FastifyRequest } from "fastify";
import type { WebSocket } from "ws";
import { BothyError } from "@bothy/protocol";
import type { RelayMeter } from "./relay-meter.ts";
import type { ViewOnlyFilter } from "./rfb-view-only.ts";

/** Bytes waiting in the WebSocket before the relay stops reading from the sandbox. */
const HIGH_WATER = 4 * 1024 * 1024;
/** Bytes of the client's kept before the connection inside is open; past them the client is paused. */
const EARLY_LIMIT = 1024 * 1024;

/**
 * Joins `socket` to the connection `open` makes. Messages that arrive before it is open are kept
 * (up to EARLY_LIMIT, then the client is paused) and sent first. Each direction honours the
 * other's pace: the client is paused while the stream into the sandbox is full (the guest channel
 * credits, or TCP's window grants, only what the sandbox's socket took), and the sandbox's side is
 * paused while the WebSocket holds HIGH_WATER; so a port that never reads, or a client that never
 * reads, costs the host a bounded amount (`RelayMeter`). Either side's end closes the other; a failure to connect
 * closes the WebSocket with 1011 and the error's code as the reason.
 */
export function relayTcp(
  socket: WebSocket,
  log: FastifyRequest["log"],
  sandboxId: string,
  meter: RelayMeter,
  open: () => Promise<Duplex>,
  /** Rewrites what the client sends (null: close the connection), e.g. a view-only VNC stream. */
  filter?: ViewOnlyFilter,
): void {
  let early: Buffer[] = [];
  let earlyBytes = 0;
  let tunnel: Duplex | undefined;
  let closed = false;
  const untrack = meter.track({
    heldBytes: () => earlyBytes + (tunnel?.writableLength ?? 0) + (filter?.held ?? 0),
    paused: () => socket.isPaused,
    close: () => close(1001, "the server is shutting down"),
  });
  function close(code: number, reason: string): void {
    if (closed) return;
    closed = true;
    untrack();
    early = [];
    earlyBytes = 0;
    tunnel?.destroy();
    // A paused socket would not read the client's closing handshake; what it reads now is dropped.
    socket.resume();
    if (socket.readyState === socket.OPEN || socket.readyState === socket.CONNECTING) socket.close(code, reason);
  }
  socket.on("message", (data: Buffer | ArrayBuffer | Buffer[]) => {
    if (closed) return;
    const raw = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
    const bytes = filter ? filter(raw) : raw;
    if (bytes === null) {
      close(1008, "not allowed on a view-only connection");
      return;
    }
    if (bytes.length === 0) return;
    if (tunnel) {
      // Full: stop reading the client until the sandbox has taken what is queued.
      if (!tunnel.write(bytes)) socket.pause();
      return;
    }
    early.push(bytes);
    earlyBytes += bytes.length;
    if (earlyBytes >= EARLY_LIMIT) socket.pause();
  });
  socket.on("close", () => close(1000, ""));
  socket.on("error", () => close(1011, "error"));
  void (async () => {
    const stream = await open();
    if (closed) {
      stream.destroy();
      return;
    }
    tunnel = stream;
    let full = false;
    for (const bytes of early) full = !stream.write(bytes) || full;
    early = [];
    earlyBytes = 0;
    stream.on("drain", () => socket.resume());
    if (!full) socket.resume();
    stream.on("data", (chunk: Buffer) => {
      socket.send(chunk, { binary: true }, () => {
        if (stream.isPaused() && socket.bufferedAmount < HIGH_WATER) stream.resume();
      });
      if (socket.bufferedAmount >= HIGH_WATER) stream.pause();
    });
    stream.on("end", () => close(1000, "closed inside the sandbox"));
    stream.on("error", () => close(1011, "connection reset inside the sandbox"));
    stream.on("close", () => close(1000, "closed inside the sandbox"));
  })().catch((err: unknown) => {
    log.warn({ err, sandbox_id: sandboxId }, "tcp relay could not connect");
    close(1011, err instanceof BothyError ? err.code : "internal");
  });
}
