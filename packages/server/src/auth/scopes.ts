import { API_SCOPES } from "@bothy/protocol";

/**
 * What each route needs of a key. `admin` holds every scope and sees every tenant; the others
 * act only inside their key's tenant.
 */

export const ALL_SCOPES = API_SCOPES;
export type Scope = (typeof API_SCOPES)[number];

/** A key made without naming scopes gets these (everything but keys and admin). */
export const DEFAULT_SCOPES: Scope[] = ["sandboxes:read", "sandboxes:write", "files", "corpus", "conversations"];

/** `public`: no key needed; `key`: any valid key; else the scope the route needs. */
export type Requirement = "public" | "key" | Scope;

/**
 * The requirement of a route, from its method and Fastify URL (`/sandboxes/:id`). A route
 * nobody listed here gets a scope by its method, so a new route is never public by accident.
 */
export function requirementOf(method: string, url: string | undefined, websocket: boolean): Requirement {
  if (url === undefined) return "key";
  if (url === "/healthz" || url === "/openapi.json") return "public";
  // The dashboard's files, and its sign-in, which takes the key in its body.
  if (url === "/ui/session") return method === "POST" ? "public" : "key";
  // A sign-in link is minted by any key, for itself (api/ui-session-routes.ts).
  if (url === "/ui/links") return "key";
  if (url === "/ui" || url.startsWith("/ui/")) return "public";
  // envd calls carry the sandbox's own access token instead (checked by the envd routes), and
  // the e2b SDK's signed file URLs a signature made with it.
  if (url === "/e2b/envd" || url.startsWith("/e2b/envd/") || url === "/files") return "public";
  if (url === "/metrics" || url.startsWith("/tenants") || url.startsWith("/nodes")) return "admin";
  if (url.startsWith("/keys")) return "keys:manage";
  if (url.startsWith("/secrets")) return "secrets";
  if (url === "/policy") return method === "GET" ? "key" : "policy";
  if (url.startsWith("/approvals")) return "approvals:decide";
  if (url.startsWith("/sandboxes/:id/files")) return "files";
  if (url.startsWith("/corpus")) return "corpus";
  if (url.startsWith("/conversations")) return "conversations";
  // The tools run commands and move files in the tenant's sandboxes.
  if (url === "/mcp") return "sandboxes:write";
  // Watching the desktop is reading: the relay drops a reader's input (rfb-view-only.ts), and a
  // link with control is asked for with sandboxes:write (desktop-routes.ts).
  if (url === "/sandboxes/:id/desktop/vnc" || url === "/sandboxes/:id/desktop/link") return "sandboxes:read";
  // The noVNC library's own files, which the live view loads before any token is checked.
  if (url === "/desktop/novnc/*") return "public";
  // @e2b/desktop's stream page: its password is the credential (e2b/stream-page.ts checks it).
  if (url === "/e2b/desktop-stream/:id/vnc.html") return "public";
  // Proxied connections and WebSockets act on the sandbox (a re-attached command takes input).
  if (url.startsWith("/sandboxes/:id/ports/") || websocket) return "sandboxes:write";
  return method === "GET" || method === "HEAD" ? "sandboxes:read" : "sandboxes:write";
}

export function hasScope(scopes: ReadonlySet<Scope>, needed: Scope): boolean {
  return scopes.has("admin") || scopes.has(needed);
}
