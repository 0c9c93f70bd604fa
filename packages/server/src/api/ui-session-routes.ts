/**
 * `/ui/session`: the dashboard's sign-in (POST with an API key in the body, or a sign-in link's
 * one-time token), what the session is (GET: its tenant, scopes and CSRF token, so the page shows
 * only the buttons its key may use), and sign-out (DELETE). `/ui/links` mints a sign-in link for
 * the calling key (`bothy ui-link`). The key never appears in a URL; the session is a cookie the
 * page cannot read (auth/ui-sessions.ts), the link's token a one-time secret (auth/ui-links.ts).
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import {
  BothyError,
  uiLinkInfo,
  uiLinkRequest,
  uiSessionInfo,
  uiSignInRequest,
  type UiLinkInfo,
  type UiSessionInfo,
} from "@bothy/protocol";
import { principalOf } from "../auth/auth-hooks.ts";
import type { KeyRing, Principal } from "../auth/key-ring.ts";
import { onPreviewHost, sameOrigin } from "../auth/session-auth.ts";
import type { UiLinks } from "../auth/ui-links.ts";
import { sessionSetCookie, type UiSessions } from "../auth/ui-sessions.ts";
import { parseInput } from "./parse-input.ts";
import { empty, json } from "./route-schema.ts";

const tags = ["dashboard"];
const DOCS = {
  signIn: {
    tags,
    summary:
      "Sign the dashboard in: exchange an API key (in the body, never a URL), or a sign-in link's one-time token, for an HttpOnly SameSite=Strict session cookie and its CSRF token",
    body: uiSignInRequest,
    response: { 201: json(uiSessionInfo, "Signed in; the cookie is set") },
  },
  get: {
    tags,
    summary: "The session (or key) calling: its tenant, scopes and CSRF token",
    response: { 200: json(uiSessionInfo, "The session") },
  },
  link: {
    tags,
    summary:
      "A one-time sign-in link for the calling key (`bothy ui-link`): its path carries a token (never the key) that signs a browser in once, within ttl_s seconds, while the key is valid. Asked with an API key, not a dashboard session",
    body: uiLinkRequest,
    response: { 201: json(uiLinkInfo, "The link; its token is shown only now") },
  },
  signOut: {
    tags,
    summary: "Sign out: the session ends and its cookie is cleared",
    response: { 204: empty("Signed out") },
  },
};

function view(principal: Principal, session: { csrf: string; expiresAt: string } | undefined): UiSessionInfo {
  return {
    key_id: principal.keyId,
    tenant: principal.tenant,
    scopes: [...principal.scopes].sort(),
    csrf_token: session?.csrf ?? null,
    expires_at: session?.expiresAt ?? null,
  };
}

export function uiSessionRoutes(
  app: FastifyInstance,
  deps: {
    ring: KeyRing;
    sessions: UiSessions;
    links: UiLinks;
    previewDomain: string | undefined;
    secureCookies: boolean;
  },
): void {
  const { ring, sessions, links, previewDomain, secureCookies } = deps;
  const maxAgeS = Math.floor(sessions.ttlMs / 1000);
  const keyHolder = async (key: string): Promise<Principal | undefined> => {
    const check = await ring.verify(key.trim());
    return check.ok ? check.principal : undefined;
  };

  /** A sign-in only from the dashboard's own page: no page of a sandbox may sign a browser in as its key. */
  const checkSignInOrigin = (request: FastifyRequest): void => {
    const host = request.headers.host ?? "";
    const origin = request.headers.origin;
    if (onPreviewHost(host, previewDomain) || (origin !== undefined && !sameOrigin(origin, host)))
      throw new BothyError(
        "origin_refused",
        "Sign in to the dashboard from its own page (/ui on the API's origin), not from another origin.",
      );
  };

  app.post("/ui/session", { schema: DOCS.signIn }, async (request: FastifyRequest, reply: FastifyReply) => {
    checkSignInOrigin(request);
    const body = parseInput(uiSignInRequest, request.body, "POST /ui/session");
    const principal = "link" in body ? await links.redeem(body.link) : await keyHolder(body.key);
    if (!principal || principal.keyId === null)
      throw new BothyError(
        "unauthorized",
        "link" in body
          ? "The sign-in link is not valid (already used, expired, or its key was revoked); run `bothy ui-link` for a new one, or paste an API key."
          : "The API key is not valid (unknown, expired or revoked); paste a current key, such as the admin key in $BOTHY_HOME/admin.key.",
      );
    const made = await sessions.create(principal.keyId);
    reply
      .code(201)
      .header("set-cookie", sessionSetCookie(made.id, secureCookies, maxAgeS))
      .header("cache-control", "no-store");
    return view(principal, made);
  });

  app.post("/ui/links", { schema: DOCS.link }, async (request, reply): Promise<UiLinkInfo> => {
    const principal = principalOf(request);
    // A session minting links would outlive itself and hand its power to whoever gets the link:
    // only the key's holder mints one.
    if (sessions.of(request.raw))
      throw new BothyError(
        "scope_missing",
        "A sign-in link is made with the API key itself (`bothy ui-link`, or POST /ui/links with Authorization: Bearer), not from a dashboard session.",
      );
    if (principal.keyId === null)
      throw new BothyError(
        "not_supported",
        "This server runs without authentication (BOTHY_AUTH=none): the dashboard needs no sign-in; open /ui.",
      );
    const { ttl_s: ttlS } = parseInput(uiLinkRequest, request.body ?? {}, "POST /ui/links");
    const made = await links.mint(principal.keyId, ttlS * 1000);
    reply.code(201).header("cache-control", "no-store");
    return { path: `/ui/#link=${made.token}`, expires_at: made.expiresAt };
  });

  app.get("/ui/session", { schema: DOCS.get }, async (request, reply) => {
    reply.header("cache-control", "no-store");
    return view(principalOf(request), sessions.of(request.raw));
  });

  app.delete("/ui/session", { schema: DOCS.signOut }, async (request, reply) => {
    // Signed in by the cookie: that session ends; by a key: there is none, only the cookie to clear.
    const session = sessions.of(request.raw);
    if (session) await sessions.end(session.id);
    reply.header("set-cookie", sessionSetCookie(undefined, secureCookies, 0)).code(204);
  });
}
