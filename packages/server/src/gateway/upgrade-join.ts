/**
 * Joins a sandbox's upgrade (WebSocket) connection to its upstream, but only once the upstream has
 * switched protocols. The request goes on a connection of its own; until a `101` nothing the
 * sandbox sent after its request (`head`, and what it keeps sending) is passed on. Any other answer
 * is relayed as an ordinary response and the sandbox's connection ends, so a request pipelined
 * behind the upgrade never reaches the upstream without being judged.
 */
import http, { type IncomingMessage, type OutgoingHttpHeaders } from "node:http";
import type { Socket } from "node:net";
import type { Duplex } from "node:stream";

export interface UpgradeJoin {
  /** The sandbox's connection, as the HTTP server handed it over (not yet read). */
  socket: Duplex;
  /** What the sandbox sent after its request's headers. */
  head: Buffer;
  /** The checked upstream address and port. */
  address: string;
  port: number;
  method: string;
  path: string;
  /** The request's headers to send, without hop-by-hop ones (Connection and Upgrade are set here). */
  headers: OutgoingHttpHeaders;
  upgrade: string;
  /** Aborts when the sandbox's side is gone. */
  gone: AbortSignal;
  /** Headers of a non-101 answer fit to relay (the caller drops hop-by-hop ones). */
  relayHeaders(headers: http.IncomingHttpHeaders): OutgoingHttpHeaders;
  /** The whole answer to write when the upstream could not be reached. */
  unreachable(err: Error): string;
}

export function joinAfterSwitch(o: UpgradeJoin): void {
  const { socket, head } = o;
  const up = http.request({
    host: o.address,
    port: o.port,
    method: o.method,
    path: o.path,
    headers: { ...o.headers, connection: "Upgrade", upgrade: o.upgrade },
    agent: false,
    setHost: false,
  });
  o.gone.addEventListener("abort", () => up.destroy());
  up.once("error", (err) => {
    if (!socket.destroyed) socket.end(o.unreachable(err));
  });
  up.once("upgrade", (upRes: IncomingMessage, upSocket: Socket, upHead: Buffer) => {
    upSocket.setNoDelay(true);
    socket.write(responseHead(upRes, upRes.headers));
    if (upHead.length > 0) socket.write(upHead);
    if (head.length > 0) upSocket.write(head);
    upSocket.on("error", () => socket.destroy());
    upSocket.once("close", () => socket.destroy());
    socket.once("close", () => upSocket.destroy());
    upSocket.pipe(socket).pipe(upSocket);
  });
  up.once("response", (upRes: IncomingMessage) => {
    socket.write(responseHead(upRes, { ...o.relayHeaders(upRes.headers), connection: "close" }));
    upRes.on("error", () => socket.destroy());
    upRes.pipe(socket);
  });
  up.end();
}

/** An upstream answer's status line and headers, for a raw socket. */
function responseHead(res: IncomingMessage, headers: OutgoingHttpHeaders): string {
  const lines = [`HTTP/1.1 ${res.statusCode ?? 502} ${res.statusMessage ?? ""}`];
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    for (const v of Array.isArray(value) ? value : [value]) lines.push(`${name}: ${String(v)}`);
  }
  return `${lines.join("\r\n")}\r\n\r\n`;
}
