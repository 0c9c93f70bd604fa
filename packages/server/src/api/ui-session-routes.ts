/**
 * `/ui/session`: the dashboard's sign-in (POST with an API key in the body), what the session is
 * (GET: its tenant, scopes and CSRF token, so the page shows only the buttons its key may use),
 * and sign-out (DELETE). The key never appears in a URL; the session is a cookie the page cannot
 * read (auth/ui-sessions.ts).
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { BothyError, uiSessionInfo, uiSignInRequest, type UiSessionInfo } from "@bothy/protocol";
import { principalOf } from "../auth/auth-hooks.ts";
import type { KeyRing, Principal } from "../auth/key-ring.ts";
import { onPreviewHost, sameOrigin } from "../auth/session-auth.ts";
import { sessionSetCookie, type UiSessions } from "../auth/ui-sessions.ts";
import { parseInput } from "./parse-input.ts";
import { empty, json } from "./route-schema.ts";

const tags = ["dashboard"];
const DOCS = {
  signIn: {
    tags,
    summary:
      "Sign the dashboard in: exchange an API key (in the body, never a URL) for an HttpOnly SameSite=Strict session cookie and its CSRF token",
    body: uiSignInRequest,
    response: { 201: json(uiSessionInfo, "Signed in; the cookie is set") },
  },
  get: {
    tags,
    summary: "The session (or key) calling: its tenant, scopes and CSRF token",
    response: { 200: json(uiSessionInfo, "The session") },
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
  deps: { ring: KeyRing; sessions: UiSessions; previewDomain: string | undefined; secureCookies: boolean },
): void {
  const { ring, sessions, previewDomain, secureCookies } = deps;
  const maxAgeS = Math.floor(sessions.ttlMs / 1000);

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
    const { key } = parseInput(uiSignInRequest, request.body, "POST /ui/session");
    const check = ring.verify(key.trim());
    if (!check.ok || check.principal.keyId === null)
      throw new BothyError(
        "unauthorized",
        "The API key is not valid (unknown, expired or revoked); paste a current key, such as the admin key in $BOTHY_HOME/admin.key.",
      );
    const made = sessions.create(check.principal.keyId);
    reply
      .code(201)
      .header("set-cookie", sessionSetCookie(made.id, secureCookies, maxAgeS))
      .header("cache-control", "no-store");
    return view(check.principal, made);
  });

  app.get("/ui/session", { schema: DOCS.get }, async (request, reply) => {
    reply.header("cache-control", "no-store");
    return view(principalOf(request), sessions.of(request.raw));
  });

  app.delete("/ui/session", { schema: DOCS.signOut }, async (request, reply) => {
    // Signed in by the cookie: that session ends; by a key: there is none, only the cookie to clear.
    const session = sessions.of(request.raw);
    if (session) sessions.end(session.id);
    reply.header("set-cookie", sessionSetCookie(undefined, secureCookies, 0)).code(204);
  });
}
