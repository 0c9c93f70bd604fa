import type { FastifyInstance, FastifyRequest } from "fastify";
import { BothyError } from "@bothy/protocol";
import type { RouteRecord } from "./openapi.ts";

const KEY_RE = /^[+/0-9A-Za-z]{22}==$/;
/** An RFC 9110 token: what each name in Sec-WebSocket-Protocol must be. */
const TOKEN_RE = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

/** What is wrong with a WebSocket handshake, checked as `ws` checks it; undefined if nothing. */
function handshakeProblem(request: FastifyRequest): string | undefined {
  const h = request.headers;
  if (h.upgrade?.toLowerCase() !== "websocket") return "Upgrade must be websocket";
  if (!KEY_RE.test(h["sec-websocket-key"] ?? "")) return "Sec-WebSocket-Key must be 16 random bytes in base64";
  if (h["sec-websocket-version"] !== "13" && h["sec-websocket-version"] !== "8")
    return "Sec-WebSocket-Version must be 13";
  const protocols = h["sec-websocket-protocol"];
  if (protocols !== undefined) {
    const names = protocols.split(",").map((p) => p.trim());
    if (names.some((n) => !TOKEN_RE.test(n)) || new Set(names).size !== names.length)
      return "Sec-WebSocket-Protocol must list distinct names separated by commas";
  }
  return undefined;
}

/**
 * Refuses a WebSocket upgrade that `ws` would refuse, or one to a route that takes none, before
 * @fastify/websocket hands it over: `ws` would answer with text/html of its own, and a route
 * without a WebSocket handler would accept the upgrade only to close it. Runs before the routes'
 * own checks, so a bad handshake is named whatever the id.
 */
export function checkWebSocketHandshakes(app: FastifyInstance, routes: readonly RouteRecord[]): void {
  app.addHook("onRequest", async (request) => {
    const url = request.routeOptions.url;
    if (!request.ws || url === undefined) return;
    const path = request.url.split("?")[0];
    const route = routes.find((r) => r.url === url && r.method === request.method.toLowerCase());
    if (!route?.websocket) {
      const sockets = routes.filter((r) => r.websocket).map((r) => r.url.replace(/:(\w+)/g, "{$1}"));
      throw new BothyError(
        "invalid_request",
        `${request.method} ${path} takes no WebSocket (those that do: GET ${sockets.join(", GET ")}); send it as plain HTTP, without Upgrade.`,
      );
    }
    const problem = handshakeProblem(request);
    if (problem)
      throw new BothyError(
        "malformed_request",
        `Not a valid WebSocket handshake: ${problem} (RFC 6455); use a WebSocket client library.`,
      );
  });
}
