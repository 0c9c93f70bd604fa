import type { IncomingMessage } from "node:http";
import { servedAtRoot } from "../api/port-routes.ts";
import { ENVD_PORT } from "./envd-routes.ts";

/** Where the E2B envd surface is mounted (E2B_SANDBOX_URL's path). */
export const ENVD_PREFIX = "/e2b/envd";

function header(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/**
 * For Fastify's `rewriteUrl` (before routing, WebSocket upgrades included): a request to the
 * envd URL whose `E2b-Sandbox-Port` is not envd's own is one for a server inside the sandbox
 * (code-interpreter's Jupyter, a user's app). It is routed as `/sandboxes/{id}/ports/{port}{rest}`,
 * so bothy's own port proxy serves it. Returns undefined for any other request.
 */
export function e2bPortRewrite(req: IncomingMessage): string | undefined {
  const url = req.url ?? "/";
  if (url !== ENVD_PREFIX && !url.startsWith(`${ENVD_PREFIX}/`) && !url.startsWith(`${ENVD_PREFIX}?`)) return undefined;
  const port = header(req, "e2b-sandbox-port");
  const id = header(req, "e2b-sandbox-id");
  if (port === undefined || port === ENVD_PORT || id === undefined) return undefined;
  // Anything malformed stays on the envd surface, which refuses it in E2B's shape.
  if (!/^[0-9]{1,5}$/.test(port) || !/^sbx_[a-z2-7]{20}$/.test(id)) return undefined;
  servedAtRoot(req);
  const rest = url.slice(ENVD_PREFIX.length);
  return `/sandboxes/${id}/ports/${port}${rest.startsWith("/") ? rest : `/${rest}`}`;
}
