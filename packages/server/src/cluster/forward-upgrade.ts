import type { IncomingMessage } from "node:http";
import { BothyError } from "@bothy/protocol";
import net, { type Socket } from "node:net";
import tls from "node:tls";
import { CONNECT_MS, unreachable, type ForwardTarget } from "./forward-http.ts";
import { FORWARDED_HEADER } from "./cluster-secret.ts";

/**
 * Relays an upgrade (every WebSocket: commands, PTY, ports, tunnels, desktop/VNC, CDP) to the node
 * that answers it: opens a connection to the owner, sends the caller's request head as it came
 * (its credentials too) plus the forwarding signature, then joins the two connections byte for
 * byte, so the owner's answer (101, or a refusal as problem+json) and every frame after it pass
 * through unchanged. `pipe` both ways is the flow control: a side that does not read stops the
 * other's reads. Resolves once connected; rejects with `node_unreachable` if the owner cannot be
 * reached (nothing has been written to the caller then).
 */
export async function forwardUpgrade(
  req: IncomingMessage,
  client: Socket,
  head: Buffer,
  /** The URL as the caller sent it (before any rewrite of this node's: the owner makes its own). */
  path: string,
  target: ForwardTarget,
  signature: string,
): Promise<void> {
  const upstream = await connect(target);
  const lines = [`${req.method ?? "GET"} ${path} HTTP/1.1`];
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2)
    if (raw[i]?.toLowerCase() !== FORWARDED_HEADER) lines.push(`${raw[i]}: ${raw[i + 1]}`);
  lines.push(`${FORWARDED_HEADER}: ${signature}`);
  upstream.write(`${lines.join("\r\n")}\r\n\r\n`);
  if (head.length > 0) upstream.write(head);
  const end = (): void => {
    client.destroy();
    upstream.destroy();
  };
  upstream.on("error", end).on("close", end);
  client.on("error", end).on("close", end);
  upstream.pipe(client);
  client.pipe(upstream);
}

function connect(target: ForwardTarget): Promise<Socket> {
  const url = new URL(target.url);
  const secure = url.protocol === "https:";
  const port = Number(url.port || (secure ? 443 : 80));
  return new Promise((resolve, reject) => {
    const socket = secure
      ? tls.connect({ host: url.hostname, port, servername: net.isIP(url.hostname) ? undefined : url.hostname })
      : net.connect({ host: url.hostname, port });
    const timer = setTimeout(
      () => socket.destroy(unreachable(target, `no connection within ${CONNECT_MS / 1000} s`)),
      CONNECT_MS,
    );
    socket.once(secure ? "secureConnect" : "connect", () => {
      clearTimeout(timer);
      socket.removeAllListeners("error");
      socket.setNoDelay(true);
      resolve(socket);
    });
    socket.once("error", (err) => {
      clearTimeout(timer);
      reject(err instanceof BothyError ? err : unreachable(target, err.message));
    });
  });
}
