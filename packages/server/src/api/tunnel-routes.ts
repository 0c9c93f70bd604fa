import type { FastifyInstance } from "fastify";
import { BothyError } from "@bothy/protocol";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import type { PortDialer } from "./port-dialer.ts";
import type { RelayMeter } from "./relay-meter.ts";
import { empty } from "./route-schema.ts";
import { relayTcp } from "./tcp-relay.ts";

type Params = { Params: { id: string; port: string } };

/**
 * `GET /sandboxes/:id/tunnel/:port` (WebSocket): a raw TCP connection to that port inside the
 * sandbox (port-dialer.ts: over its network where it has one, else the guest channel to 127.0.0.1),
 * its bytes in binary messages, for protocols that are not HTTP (a database, VNC, SSH).
 * `bothy port ID PORT --forward LOCAL` serves it on a local port.
 */
export function tunnelRoutes(
  app: FastifyInstance,
  manager: SandboxManager,
  relays: RelayMeter,
  dialer: PortDialer,
): void {
  app.route<Params>({
    method: "GET",
    url: "/sandboxes/:id/tunnel/:port",
    schema: {
      tags: ["ports"],
      summary:
        "WebSocket: a raw TCP connection to 127.0.0.1:{port} inside the sandbox, its bytes in binary messages (what `bothy port --forward` uses)",
      response: { 101: empty("Switching to WebSocket") },
    },
    preValidation: async (request) => {
      await manager.info(request.params.id);
      const port = Number(request.params.port);
      if (!/^[0-9]{1,5}$/.test(request.params.port) || port < 1 || port > 65535)
        throw new BothyError("invalid_request", `"${request.params.port.slice(0, 16)}" is not a TCP port (1-65535).`);
    },
    handler: async () => {
      throw new BothyError(
        "upgrade_required",
        "This endpoint is a raw TCP tunnel over a WebSocket (binary messages); use `bothy port ID PORT --forward LOCAL`, or /sandboxes/ID/ports/PORT/ for HTTP.",
      );
    },
    wsHandler: (socket, request) => {
      const { id } = request.params;
      relayTcp(socket, request.log, id, relays, () => dialer.open(id, Number(request.params.port)));
    },
  });
}
