/**
 * Authentication, scopes and tenant isolation for every route, before any route's own checks:
 * the key from `Authorization: Bearer` or `X-API-Key` (HTTP, WebSocket upgrades, SSE, /mcp and
 * the E2B control plane) or the dashboard's session cookie acting as its key, the scope the route needs, and a sandbox id of another tenant answered
 * exactly as an unknown one.
 */
import type { Socket } from "node:net";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { BothyError, SANDBOX_ID_RE } from "@bothy/protocol";
import { KEYS_CHANNEL } from "../ledger/auth-rows.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { type KeyRing, NO_AUTH_PRINCIPAL, type Principal } from "./key-ring.ts";
import { hasScope, requirementOf, type Scope } from "./scopes.ts";

declare module "fastify" {
  interface FastifyRequest {
    /** Who is asking; set for every route but the public ones. */
    principal: Principal | null;
  }
}

const REALM = 'Bearer realm="bothy"';

/** Routes whose `:id` is a sandbox id (bothy's own and the E2B control plane's). */
const SANDBOX_ROUTE = /^(\/e2b(\/v2)?)?\/sandboxes\/:id(\/|$)/;
/** Long-lived answers a revoked key loses at once (WebSockets are found by `request.ws`). */
const STREAM_ROUTES = new Set(["/events", "/mcp"]);

/** The same answer an unknown sandbox id gets from the routes (SandboxManager.info). */
export function sandboxNotFound(id: string): BothyError {
  return new BothyError("sandbox_not_found", `No sandbox ${id}; list them with GET /sandboxes.`);
}

/** Whether a principal may see a tenant's objects: its own, or every tenant's with `admin`. */
export function sees(principal: Principal, tenant: string): boolean {
  return principal.scopes.has("admin") || principal.tenant === tenant;
}

/**
 * The key a request presents: a bothy key as Bearer, else X-API-Key (so an app behind the port
 * proxy keeps its own Authorization), else whatever Bearer token there is; "" for an
 * Authorization that is no Bearer token at all.
 */
function presentedKey(request: FastifyRequest): string | undefined {
  const auth = request.headers.authorization;
  const bearer = auth === undefined ? undefined : (/^Bearer\s+(\S+)\s*$/i.exec(auth)?.[1] ?? "");
  if (bearer?.startsWith("bothy_")) return bearer;
  const header = request.headers["x-api-key"];
  const apiKey = Array.isArray(header) ? header[0] : header;
  return apiKey ?? bearer;
}

function refuse(reply: FastifyReply, challenge: string, message: string): BothyError {
  reply.header("www-authenticate", challenge);
  return new BothyError("unauthorized", message);
}

/** The open WebSockets and event streams of each key, ended when it is revoked. */
export class KeyConnections {
  private readonly byKey = new Map<string, Set<Socket>>();

  track(keyId: string, socket: Socket): void {
    let set = this.byKey.get(keyId);
    if (!set) this.byKey.set(keyId, (set = new Set()));
    set.add(socket);
    socket.once("close", () => {
      set.delete(socket);
      if (set.size === 0 && this.byKey.get(keyId) === set) this.byKey.delete(keyId);
    });
  }

  end(keyId: string): void {
    for (const socket of this.byKey.get(keyId) ?? []) socket.destroy();
    this.byKey.delete(keyId);
  }

  /**
   * On a database several nodes share: ends this node's connections of a key revoked through
   * another node. A notification names the key; the key's row decides. After notifications may
   * have been missed, every key with an open connection here is checked.
   */
  follow(ledger: LedgerStore, ring: Pick<KeyRing, "holder">): () => void {
    const check = (keyId: string): void =>
      void ring.holder(keyId).then(
        (holder) => {
          if (!holder) this.end(keyId);
        },
        // Unreadable now: the next notification, or the key's next request, decides.
        () => undefined,
      );
    return ledger.listen(KEYS_CHANNEL, (keyId) => {
      if (keyId !== undefined) check(keyId);
      else for (const open of [...this.byKey.keys()]) check(open);
    });
  }
}

/**
 * A request that authenticates with something made for one sandbox instead of an API key (E2B's
 * port traffic token, a signed link): the sandbox it was made for and the scopes it gives, when
 * it verifies for this route (`url`, Fastify's). The principal it makes acts on that sandbox only.
 */
export type SandboxGrant = (
  request: FastifyRequest,
  url: string,
) => Promise<{ sandbox: string; scopes: Scope[] } | undefined>;

export function authHooks(
  app: FastifyInstance,
  options: {
    ring: KeyRing;
    ledger: LedgerStore;
    mode: "keys" | "none";
    connections: KeyConnections;
    sandboxGrant?: SandboxGrant;
    /** The dashboard's cookie, for a request that presents no key (auth/session-auth.ts). */
    session?: (request: FastifyRequest) => Promise<Principal | undefined>;
  },
): void {
  const { ring, ledger, mode, connections, sandboxGrant, session } = options;

  /** The principal of a request to one sandbox that carries a grant for that sandbox and route. */
  const granted = async (request: FastifyRequest, url: string | undefined): Promise<Principal | undefined> => {
    if (!sandboxGrant || url === undefined) return undefined;
    const grant = await sandboxGrant(request, url);
    if (grant === undefined || (request.params as { id?: unknown }).id !== grant.sandbox) return undefined;
    const tenant = await ledger.auth.sandboxTenant(grant.sandbox);
    return tenant === undefined ? undefined : { keyId: null, tenant, scopes: new Set(grant.scopes) };
  };
  app.decorateRequest("principal", null);
  app.addHook("onRequest", async (request, reply) => {
    const url = request.routeOptions.url;
    const need = requirementOf(request.method, url, request.ws);
    if (need === "public") return;
    let principal: Principal;
    const key = presentedKey(request);
    const grant = key === undefined ? await granted(request, url) : undefined;
    const signedIn = key === undefined && !grant && mode !== "none" ? await session?.(request) : undefined;
    if (mode === "none") principal = NO_AUTH_PRINCIPAL;
    else if (grant) principal = grant;
    else if (signedIn) principal = signedIn;
    else {
      if (key === undefined || key === "")
        throw refuse(
          reply,
          REALM,
          "This server needs an API key: send Authorization: Bearer <key> (or X-API-Key). `bothy keys create` makes one; the first start wrote an admin key to $BOTHY_HOME/admin.key.",
        );
      const check = await ring.verify(key);
      if (!check.ok)
        throw refuse(
          reply,
          `${REALM}, error="invalid_token"`,
          "The API key is not valid (unknown, expired or revoked); send a current key, or ask for a new one with `bothy keys create`.",
        );
      principal = check.principal;
    }
    if (need !== "key" && !hasScope(principal.scopes, need))
      throw new BothyError(
        "scope_missing",
        `This key lacks the scope ${need}, which ${request.method} ${url ?? request.url.split("?")[0]} needs; use a key made with it.`,
        { details: { scope: need } },
      );
    request.principal = principal;
    if (principal.keyId !== null && (request.ws || (request.method === "GET" && STREAM_ROUTES.has(url ?? ""))))
      connections.track(principal.keyId, request.raw.socket);
  });

  // Another tenant's sandbox id is answered exactly as an unknown one: both get the same 404
  // here, after the body is read (so a bad body fails alike) and before any route looks at it.
  app.addHook("preValidation", async (request) => {
    const url = request.routeOptions.url;
    const id = (request.params as { id?: unknown } | undefined)?.id;
    const principal = request.principal;
    if (!principal || url === undefined || !SANDBOX_ROUTE.test(url)) return;
    if (typeof id !== "string" || !SANDBOX_ID_RE.test(id)) return;
    const tenant = await ledger.auth.sandboxTenant(id);
    if (tenant === undefined || !sees(principal, tenant)) throw sandboxNotFound(id);
  });
}

/** The principal of a request past the hook above (public routes have none). */
export function principalOf(request: FastifyRequest): Principal {
  if (!request.principal) throw new BothyError("internal", "A route that needs a key ran without one.");
  return request.principal;
}
