/**
 * What crosses the port proxy's boundary in headers, both ways. Into the guest go the client's
 * headers without any credential of bothy's or E2B's. Back to the client go the app's headers
 * filtered by where the page lands: the path form (`/sandboxes/ID/ports/PORT/`) is on the API's
 * own origin, so its pages run as an opaque origin (a CSP sandbox without `allow-same-origin`)
 * and may set no cookie there; a preview host (`PORT-ID.<domain>`) is the app's own origin, whose
 * cookies stay host-only so one sandbox's host cannot set them for another's.
 */
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from "node:http";

/** Where a proxied response is shown: on the API's origin, or on a preview host of its own. */
export type PortForm = "path" | "preview";

/**
 * For pages served on the API's origin: scripts, forms and popups work, but without
 * `allow-same-origin` the page is an opaque origin: no cookies or storage of the API's origin, and
 * every request it makes (to the API, to another sandbox's port) is cross-origin and cross-site.
 */
export const PATH_FORM_CSP = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads";

/**
 * Cookie names bothy reserves (the port link's `bothy_link`, and any later session cookie of its
 * own), with or without a `__Host-`/`__Secure-` prefix: never passed into a guest, never set by one.
 */
const BOTHY_COOKIE = /^(__host-|__secure-)?bothy_/i;

/** Headers that carry a sandbox's E2B tokens (envd's and the traffic token). */
const E2B_TOKEN_HEADERS = ["x-access-token", "e2b-traffic-access-token"] as const;

/** Whether a header value holds a bothy API key anywhere (`bothy_` and 64 hex digits). */
const BOTHY_KEY = /bothy_[0-9a-f]{64}/i;

/** A Cookie header without bothy's cookies (undefined when nothing else is left). */
export function withoutBothyCookies(header: string): string | undefined {
  const kept = header
    .split(";")
    .map((p) => p.trim())
    .filter((p) => p !== "" && !BOTHY_COOKIE.test(p.split("=")[0]?.trim() ?? ""));
  return kept.length === 0 ? undefined : kept.join("; ");
}

/**
 * The client's headers (hop-by-hop ones already gone) for the app inside, without what let them
 * in: a bothy key (as Bearer or X-API-Key), an E2B access or traffic token, bothy's cookies. No key,
 * token or link enters a guest.
 */
export function toGuest(headers: OutgoingHttpHeaders): OutgoingHttpHeaders {
  const out = { ...headers };
  const authorization = String(out["authorization"] ?? "");
  if (/^Bearer\s+bothy_/i.test(authorization) || BOTHY_KEY.test(authorization)) delete out["authorization"];
  const apiKey = String(out["x-api-key"] ?? "");
  if (apiKey.startsWith("bothy_") || BOTHY_KEY.test(apiKey)) delete out["x-api-key"];
  for (const name of E2B_TOKEN_HEADERS) delete out[name];
  if (typeof out["cookie"] === "string") {
    const rest = withoutBothyCookies(out["cookie"]);
    if (rest === undefined) delete out["cookie"];
    else out["cookie"] = rest;
  }
  return out;
}

/** A Set-Cookie of the app made host-only (its Domain attribute dropped); undefined for one of bothy's names. */
function hostOnly(setCookie: string): string | undefined {
  const [pair = "", ...attributes] = setCookie.split(";");
  if (BOTHY_COOKIE.test(pair.split("=")[0]?.trim() ?? "")) return undefined;
  return [pair, ...attributes.filter((a) => a.split("=")[0]?.trim().toLowerCase() !== "domain")].join(";");
}

/**
 * The app's response headers (hop-by-hop ones already gone) as the client gets them. Either form:
 * no `Clear-Site-Data` (its "cookies" would clear the whole site's, other sandboxes' links and the
 * API's included). Path form: no `Set-Cookie` (the API's origin holds no cookie of an app), the CSP
 * sandbox above added (the app's own policy still applies beside it: policies only add up), and
 * `nosniff`. Preview form: cookies host-only and none of bothy's names.
 */
export function toClient(headers: IncomingHttpHeaders | OutgoingHttpHeaders, form: PortForm): OutgoingHttpHeaders {
  const out: Record<string, number | string | string[]> = {};
  for (const [name, value] of Object.entries(headers))
    if (value !== undefined && name !== "clear-site-data" && name !== "set-cookie") out[name] = value;
  if (form === "path") {
    const own = out["content-security-policy"];
    out["content-security-policy"] = [PATH_FORM_CSP, ...[own ?? []].flat().map(String)];
    out["x-content-type-options"] = "nosniff";
    return out;
  }
  const cookies = [headers["set-cookie"] ?? []]
    .flat()
    .map((c) => hostOnly(String(c)))
    .filter((c): c is string => c !== undefined);
  if (cookies.length > 0) out["set-cookie"] = cookies;
  return out;
}
