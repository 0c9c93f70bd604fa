/**
 * When the dashboard's cookie authenticates a request. The cookie is a browser's ambient
 * credential, so it counts only where no page of a sandbox can make the browser send it:
 * - never on a port route or a preview host (`PORT-ID.<domain>`): those serve sandbox pages;
 * - never with an `Origin` other than the API's own (a page of a preview host is same-site with
 *   the API when they share a domain, and a CSP-sandboxed page says `Origin: null`); a WebSocket
 *   must name its Origin, which browsers always do;
 * - never when the browser says the request came from another origin (`Sec-Fetch-Site` other than
 *   `same-origin` or `none`; browsers send it over HTTPS only);
 * - every request carries the session's CSRF token in `X-CSRF-Token`, which only the dashboard's
 *   own page holds: a GET a page makes without CORS (an image, a no-cors fetch) carries no Origin,
 *   yet the SameSite=Strict cookie goes along from a same-site preview host, and a cross-origin
 *   page cannot add a header without a preflight this server never grants. Exempt: WebSockets
 *   (their Origin is checked above), `GET /events` (EventSource sends no headers; a stream a page
 *   of another origin cannot read), and `GET /ui/session`, which the page asks for the token, with
 *   the header present but any value.
 */
import type { FastifyRequest } from "fastify";
import { BothyError } from "@bothy/protocol";
import { hostName, type HostNames } from "./host-check.ts";
import type { Principal } from "./key-ring.ts";
import { CSRF_HEADER, csrfMatches, sessionCookie, type UiSessions } from "./ui-sessions.ts";

/** Whether a request may come without the session's own token (see above). */
function tokenRule(method: string, url: string, ws: boolean): "none" | "present" | "match" {
  if (ws || (method === "GET" && url === "/events")) return "none";
  if (method === "GET" && url === "/ui/session") return "present";
  return "match";
}

/** Whether a Host names a preview host (or the preview domain itself), where sandbox pages live. */
export function onPreviewHost(host: string, previewDomain: string | undefined): boolean {
  const name = hostName(host);
  if (previewDomain === undefined || name === undefined) return false;
  return name === previewDomain || name.endsWith(`.${previewDomain}`);
}

/** Whether an Origin header names the host the request was sent to (the API's own origin). */
export function sameOrigin(origin: string, host: string): boolean {
  if (origin === "null") return false;
  try {
    return new URL(origin).host === host.trim().toLowerCase();
  } catch {
    // Not a URL at all: not this origin.
    return false;
  }
}

/** Refusals and the principal of a request that came with the dashboard's cookie (and no key). */
export function sessionAuth(
  sessions: UiSessions,
  names: Pick<HostNames, "previewDomain">,
): (request: FastifyRequest) => Promise<Principal | undefined> {
  return async (request) => {
    const id = sessionCookie(request.headers.cookie);
    if (id === undefined) return undefined;
    const url = request.routeOptions.url ?? "";
    const host = request.headers.host;
    if (host === undefined || url.startsWith("/sandboxes/:id/ports/") || onPreviewHost(host, names.previewDomain))
      return undefined;
    const origin = request.headers.origin;
    const site = request.headers["sec-fetch-site"];
    const otherSite = site !== undefined && site !== "same-origin" && site !== "none";
    if (otherSite || ((origin !== undefined || request.ws) && !sameOrigin(origin ?? "null", host)))
      throw new BothyError(
        "origin_refused",
        "The dashboard's session cookie is accepted only from the dashboard's own origin; call the API with an API key (Authorization: Bearer) from elsewhere.",
      );
    const session = await sessions.check(id);
    if (!session)
      throw new BothyError(
        "unauthorized",
        "The dashboard session has ended (signed out, expired, or its key was revoked or expired); sign in again at /ui.",
      );
    const header = request.headers[CSRF_HEADER];
    const presented = Array.isArray(header) ? header[0] : header;
    const rule = tokenRule(request.method, url, request.ws);
    if ((rule === "present" && presented === undefined) || (rule === "match" && !csrfMatches(presented, session.csrf)))
      throw new BothyError(
        "csrf_token_invalid",
        `A request made with the dashboard's cookie needs the session's CSRF token in ${CSRF_HEADER} (GET /ui/session returns it, asked with ${CSRF_HEADER}: fetch); or call the API with an API key instead.`,
      );
    sessions.remember(request.raw, session);
    return session.principal;
  };
}
