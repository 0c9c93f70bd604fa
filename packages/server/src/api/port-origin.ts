/**
 * Cross-origin requests a browser sends with ambient credentials (a port link's cookie, or none
 * at all on a server without keys) are refused: WebSocket upgrades (which have no CORS), writes,
 * and reads too (an app that answers CORS with any origin would otherwise let another sandbox's
 * page read it). Preview hosts of different sandboxes are same-site, so a page on one of them gets
 * a `SameSite=Lax` cookie of another sent along; only the `Origin` header tells the two apart.
 * Browsers send it on every cross-origin request but a plain navigation or embed (`<a>`, `<img>`),
 * whose answer the sending page cannot read. A request that carries its credential itself (an API
 * key, a link's `?token=`, an E2B token) cannot be forged by a page that lacks it, and passes.
 */
import type { IncomingHttpHeaders } from "node:http";
import { BothyError } from "@bothy/protocol";

/** `host[:port]` as a URL of `protocol` writes it (lower-case, the scheme's default port left out); undefined if no host. */
function hostAs(protocol: string, host: string): string | undefined {
  try {
    const url = new URL(`${protocol}//${host}`);
    return url.host === "" || url.username !== "" || url.pathname !== "/" ? undefined : url.host;
  } catch {
    return undefined;
  }
}

/**
 * Whether `origin` (the Origin header) is the origin the request was sent to (its Host). The scheme
 * is taken from the Origin itself: behind a TLS-terminating proxy the server cannot see it, and a
 * host name of another sandbox differs in its host anyway. `null` (an opaque origin, such as a
 * path-form page under its CSP sandbox) is never the request's own.
 */
export function sameOrigin(origin: string, host: string | undefined): boolean {
  let parsed: URL;
  try {
    parsed = new URL(origin);
  } catch {
    return false;
  }
  if (parsed.origin === "null" || host === undefined) return false;
  return parsed.host === hostAs(parsed.protocol, host);
}

/**
 * Throws 403 `origin_refused` for a request (any method, WebSocket upgrades included) that came in
 * on ambient credentials with an `Origin` naming another origin, or `null`. Requests without
 * `Origin` (command-line clients, SDKs, a browser's same-origin GET or navigation) pass.
 */
export function refuseCrossOrigin(
  request: { method: string; headers: IncomingHttpHeaders; ws: boolean },
  ambient: boolean,
): void {
  if (!ambient) return;
  const origin = request.headers.origin;
  if (origin === undefined || sameOrigin(origin, request.headers.host)) return;
  throw new BothyError(
    "origin_refused",
    `A ${request.ws ? "WebSocket" : request.method} request from ${JSON.stringify(origin.slice(0, 200))} to this port was refused: a port link's cookie only serves pages of the port's own origin. Open the port's own URL (its preview host name), or send an API key.`,
  );
}
