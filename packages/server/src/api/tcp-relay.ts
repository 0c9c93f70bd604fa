/**
 * A WebSocket whose binary messages are the bytes of one TCP connection inside a sandbox (over the
 * guest channel): bothy's own websockify. Serves the desktop's VNC stream and `/tunnel/{port}`
 * (what `bothy port --forward` connects to).
 */
import type { FastifyRequest } from "fastify";
import type { WebSocket } from "ws";
import { BothyError } from "@bothy/protocol";
import type { TcpStream } from "../agent/tcp-stream.ts";
import type { RelayMeter } from "./relay-meter.ts";

/** Bytes waiting in the WebSocket before the relay stops reading from the sandbox. */
const HIGH_WATER = 4 * 1024 * 1024;

/**
 * Joins `socket` to the connection `open` makes. Messages that arrive before it is open are kept
 * and sent first. Either side's end closes the other; a failure to connect closes the WebSocket
 * with 1011 and the error's code as the reason.
 */
export function relayTcp(
  socket: WebSocket,
  log: FastifyRequest["log"],
  sandboxId: string,
  meter: RelayMeter,
  open: () => Promise<TcpStream>,
  /** Rewrites what the client sends (null: close the connection), e.g. a view-only VNC stream. */
  filter?: (bytes: Buffer) => Buffer | null,
): void {
  const early: Buffer[] = [];
  let tunnel: TcpStream | undefined;
  let closed = false;
  const untrack = meter.track({
    heldBytes: () => early.reduce((n, b) => n + b.length, 0) + (tunnel?.writableLength ?? 0),
    paused: () => socket.isPaused,
  });
  const close = (code: number, reason: string): void => {
    if (closed) return;
    closed = true;
    untrack();
    tunnel?.destroy();
    if (socket.readyState === socket.OPEN || socket.readyState === socket.CONNECTING) socket.close(code, reason);
  };
  socket.on("message", (data: Buffer | ArrayBuffer | Buffer[]) => {
    const raw = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
    const bytes = filter ? filter(raw) : raw;
    if (bytes === null) {
      close(1008, "not allowed on a view-only connection");
      return;
    }
    if (bytes.length === 0) return;
    if (tunnel) tunnel.write(bytes);
    else early.push(bytes);
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
    for (const bytes of early.splice(0)) stream.write(bytes);
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
