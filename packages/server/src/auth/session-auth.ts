/**
 * When the dashboard's cookie authenticates a request. The cookie is a browser's ambient
 * credential, so it counts only where no page of a sandbox can make the browser send it:
 * - never on a port route or a preview host (`PORT-ID.<domain>`): those serve sandbox pages;
 * - never with an `Origin` other than the API's own (a page of a preview host is same-site with
 *   the API when they share a domain, and a CSP-sandboxed page says `Origin: null`); a WebSocket
 *   must name its Origin, which browsers always do;
 * - a state-changing request also carries the session's CSRF token in `X-CSRF-Token`, which only
 *   the dashboard's own page holds (a custom header a cross-origin page cannot send unasked).
 */
import type { FastifyRequest } from "fastify";
import { BothyError } from "@bothy/protocol";
import { hostName, type HostNames } from "./host-check.ts";
import type { Principal } from "./key-ring.ts";
import { CSRF_HEADER, csrfMatches, sessionCookie, type UiSessions } from "./ui-sessions.ts";

const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);

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
): (request: FastifyRequest) => Principal | undefined {
  return (request) => {
    const id = sessionCookie(request.headers.cookie);
    if (id === undefined) return undefined;
    const url = request.routeOptions.url ?? "";
    const host = request.headers.host;
    if (host === undefined || url.startsWith("/sandboxes/:id/ports/") || onPreviewHost(host, names.previewDomain))
      return undefined;
    const origin = request.headers.origin;
    if ((origin !== undefined || request.ws) && !sameOrigin(origin ?? "null", host))
      throw new BothyError(
        "origin_refused",
        "The dashboard's session cookie is accepted only from the dashboard's own origin; call the API with an API key (Authorization: Bearer) from elsewhere.",
      );
    const session = sessions.check(id);
    if (!session)
      throw new BothyError(
        "unauthorized",
        "The dashboard session has ended (signed out, expired, or its key was revoked or expired); sign in again at /ui.",
      );
    const header = request.headers[CSRF_HEADER];
    if (!SAFE_METHODS.has(request.method) && !csrfMatches(Array.isArray(header) ? header[0] : header, session.csrf))
      throw new BothyError(
        "csrf_token_invalid",
        `A state-changing request made with the dashboard's cookie needs the session's CSRF token in ${CSRF_HEADER}; GET /ui/session returns it.`,
      );
    sessions.remember(request.raw, session);
    return session.principal;
  };
}
