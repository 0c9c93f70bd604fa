/**
 * Dashboard sessions against a real ledger, and the rules by which the cookie counts, from the
 * side of a page that is not the dashboard's: another origin, a preview host, a port route, no
 * CSRF token, a revoked key, an expired session.
 */
import { createHash } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { FastifyRequest } from "fastify";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { KeyRing } from "../src/auth/key-ring.ts";
import { sessionAuth } from "../src/auth/session-auth.ts";
import { csrfOf, sessionCookie, sessionSetCookie, UiSessions } from "../src/auth/ui-sessions.ts";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";

let home: string;
let ledger: LedgerStore;
let ring: KeyRing;
let sessions: UiSessions;
let keyId: string;

beforeEach(async () => {
  home = await mkdtemp(join(tmpdir(), "bothy-sessions-"));
  ledger = await openStore({ sqlitePath: join(home, "ledger.sqlite") });
  ring = await KeyRing.open(home, ledger);
  keyId = (await ring.mint({ tenant: "default", name: "k", scopes: ["sandboxes:read"], expiresAt: null })).view.key_id;
  sessions = new UiSessions(ledger, ring);
});

afterEach(async () => {
  await ledger.close();
  await rm(home, { recursive: true, force: true });
});

/** A request as the auth hook sees it (only what sessionAuth reads). */
function request(
  id: string,
  over: { method?: string; url?: string; ws?: boolean; headers?: Record<string, string> } = {},
): FastifyRequest {
  return {
    method: over.method ?? "GET",
    ws: over.ws ?? false,
    routeOptions: { url: over.url ?? "/sandboxes" },
    headers: { host: "bothy.test:8080", cookie: `other=1; bothy_session=${id}`, ...over.headers },
    raw: {},
  } as unknown as FastifyRequest;
}

describe("dashboard sessions", () => {
  it("keeps only a digest, acts as its key, and ends with sign-out, expiry or the key's revocation", async () => {
    const made = await sessions.create(keyId);
    const row = await ledger.sessions.get(createHash("sha256").update(made.id).digest("hex"));
    expect(row).toMatchObject({ key_id: keyId, expires_at: made.expiresAt });
    expect(JSON.stringify(row)).not.toContain(made.id);
    expect((await sessions.check(made.id))?.principal.keyId).toBe(keyId);
    expect((await sessions.check(made.id))?.csrf).toBe(csrfOf(made.id));
    expect(await sessions.check(made.id, Date.parse(made.expiresAt))).toBeUndefined();

    const second = await sessions.create(keyId);
    await sessions.end(second.id);
    expect(await sessions.check(second.id)).toBeUndefined();

    await ring.revoke(keyId);
    expect(await sessions.check(made.id)).toBeUndefined();
    expect(await sessions.check("not a session id")).toBeUndefined();
  });

  it("sets a host-only HttpOnly SameSite=Strict cookie (Secure and __Host- with TLS) and reads it back", async () => {
    expect(sessionSetCookie("abc", false, 60)).toBe("bothy_session=abc; HttpOnly; SameSite=Strict; Path=/; Max-Age=60");
    expect(sessionSetCookie("abc", true, 60)).toBe(
      "__Host-bothy_session=abc; HttpOnly; SameSite=Strict; Path=/; Max-Age=60; Secure",
    );
    expect(sessionCookie("a=1; __Host-bothy_session=xyz")).toBe("xyz");
    expect(sessionCookie("bothy_link=t")).toBeUndefined();
  });

  it("lets the cookie count only from the dashboard's own origin, with its CSRF token", async () => {
    const { id, csrf } = await sessions.create(keyId);
    const auth = sessionAuth(sessions, { previewDomain: "preview.bothy.test" });
    const token = { "x-csrf-token": csrf };
    expect((await auth(request(id, { headers: token })))?.keyId).toBe(keyId);
    expect(
      (await auth(request(id, { method: "POST", headers: { ...token, origin: "http://bothy.test:8080" } })))?.keyId,
    ).toBe(keyId);
    // A page of a preview host of the same site, and a CSP-sandboxed one (Origin: null).
    for (const origin of ["http://8000-sbx.preview.bothy.test:8080", "null"])
      await expect(auth(request(id, { method: "POST", headers: { ...token, origin } }))).rejects.toThrow(
        expect.objectContaining({ code: "origin_refused" }),
      );
    await expect(auth(request(id, { headers: { ...token, "sec-fetch-site": "same-site" } }))).rejects.toThrow(
      expect.objectContaining({ code: "origin_refused" }),
    );
    // A WebSocket must name its Origin.
    await expect(auth(request(id, { ws: true, url: "/sandboxes/:id/command" }))).rejects.toThrow(
      expect.objectContaining({ code: "origin_refused" }),
    );
    // No token, or a wrong one: refused; GET /ui/session takes any, GET /events none.
    await expect(auth(request(id))).rejects.toThrow(expect.objectContaining({ code: "csrf_token_invalid" }));
    await expect(auth(request(id, { method: "DELETE", headers: { "x-csrf-token": "x" } }))).rejects.toThrow(
      expect.objectContaining({ code: "csrf_token_invalid" }),
    );
    expect((await auth(request(id, { url: "/ui/session", headers: { "x-csrf-token": "fetch" } })))?.keyId).toBe(keyId);
    await expect(auth(request(id, { url: "/ui/session" }))).rejects.toThrow(
      expect.objectContaining({ code: "csrf_token_invalid" }),
    );
    expect((await auth(request(id, { url: "/events" })))?.keyId).toBe(keyId);
    // Never on a port route or a preview host: there the cookie is no credential at all.
    expect(await auth(request(id, { url: "/sandboxes/:id/ports/:port/*", headers: token }))).toBeUndefined();
    expect(
      await auth(request(id, { headers: { ...token, host: "8000-sbx.preview.bothy.test:8080" } })),
    ).toBeUndefined();
    // A session that ended is refused as such.
    await sessions.end(id);
    await expect(auth(request(id, { headers: token }))).rejects.toThrow(
      expect.objectContaining({ code: "unauthorized" }),
    );
  });
});
