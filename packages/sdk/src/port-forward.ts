/**
 * A local TCP port that reaches a port inside a sandbox: each connection accepted on loopback
 * gets its own WebSocket to the server's `/sandboxes/{id}/tunnel/{port}`, which relays the bytes
 * over the guest channel. Any TCP protocol works (a database, SSH, VNC), not only HTTP.
 */
import { createServer, isIPv6, type Server, type Socket } from "node:net";
import WebSocket, { createWebSocketStream } from "ws";
import type { HttpClient } from "./http-client.ts";

export interface ForwardOptions {
  /** The local port; 0 (default) picks a free one. */
  localPort?: number;
  /** A loopback address to listen on (default 127.0.0.1): the forward is never offered to the network. */
  host?: string;
}

export interface PortForward {
  host: string;
  localPort: number;
  /** Stops listening and ends the open connections. */
  close(): Promise<void>;
}

const LOOPBACK = /^(127\.\d{1,3}\.\d{1,3}\.\d{1,3}|::1|localhost)$/;

export async function forwardPort(
  http: HttpClient,
  sandboxId: string,
  port: number,
  options: ForwardOptions = {},
): Promise<PortForward> {
  const host = options.host ?? "127.0.0.1";
  if (!LOOPBACK.test(host))
    throw new RangeError(`${host} is not a loopback address: a forward listens on 127.0.0.1 or ::1 only.`);
  const open = new Set<Socket>();
  const server: Server = createServer((local) => {
    open.add(local);
    const ws = new WebSocket(http.wsUrl(`/sandboxes/${sandboxId}/tunnel/${port}`), { headers: http.authHeaders() });
    const remote = createWebSocketStream(ws);
    const end = (): void => {
      local.destroy();
      remote.destroy();
      open.delete(local);
    };
    local.on("error", end);
    local.on("close", end);
    remote.on("error", end);
    remote.on("close", end);
    local.pipe(remote).pipe(local);
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.localPort ?? 0, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const address = server.address();
  const localPort = typeof address === "object" && address ? address.port : (options.localPort ?? 0);
  return {
    host: isIPv6(host) ? `[${host}]` : host,
    localPort,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of open) socket.destroy();
        server.close(() => resolve());
      }),
  };
}
