import { once } from "node:events";
import { createServer, type AddressInfo, type Server } from "node:net";
import { terminateTls, type TerminateOptions } from "../../src/gateway/tls-terminator.ts";

/**
 * A loopback listener that hands each connection to the TLS terminator as the egress proxy does:
 * the first bytes (the ClientHello) peeked, the socket paused. Answers the server (the caller
 * closes it) and its port.
 */
export async function terminatorListener(
  options: Omit<TerminateOptions, "socket" | "peeked">,
  address = "127.0.0.1",
): Promise<{ server: Server; port: number }> {
  const server = createServer((socket) => {
    socket.once("data", (peeked: Buffer) => {
      socket.pause();
      void terminateTls({ ...options, socket, peeked });
    });
  });
  server.listen(0, address);
  await once(server, "listening");
  return { server, port: (server.address() as AddressInfo).port };
}
