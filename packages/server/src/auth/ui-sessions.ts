/**
 * The dashboard's sign-in sessions. An API key pasted once becomes a random session id that the
 * browser holds as an HttpOnly, SameSite=Strict cookie; the ledger keeps only its SHA-256 and the
 * key it acts as, so the session has exactly that key's tenant and scopes and ends when the key
 * is revoked or expires (read on every request). The CSRF token is derived from the id, handed to
 * the page in a body (never a cookie), and required as `X-CSRF-Token` on every state-changing
 * request the cookie authenticates.
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import type { IncomingMessage } from "node:http";
import type { LedgerStore } from "../ledger/store.ts";
import type { KeyRing, Principal } from "./key-ring.ts";

/** The cookie's name on plain HTTP; with TLS the `__Host-` form, which the browser binds to this host and path /. */
export const SESSION_COOKIE = "bothy_session";
export const SECURE_SESSION_COOKIE = `__Host-${SESSION_COOKIE}`;
export const CSRF_HEADER = "x-csrf-token";
/** How long a session lasts from sign-in. */
export const SESSION_TTL_MS = 12 * 60 * 60 * 1000;
const SESSION_ID_RE = /^[A-Za-z0-9_-]{43}$/;

export interface SessionCheck {
  principal: Principal;
  csrf: string;
  /** The session id (for sign-out). */
  id: string;
  expiresAt: string;
}

const sha256 = (value: string): string => createHash("sha256").update(value).digest("hex");

/** The CSRF token of a session: knowing it tells nothing of the id (a one-way hash of it). */
export function csrfOf(id: string): string {
  return createHash("sha256").update(`bothy-csrf:${id}`).digest("base64url");
}

/** Compares a presented CSRF token with the session's in constant time. */
export function csrfMatches(presented: string | undefined, expected: string): boolean {
  if (presented === undefined) return false;
  const a = Buffer.from(presented);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** The session id in a Cookie header, if any (either name). */
export function sessionCookie(header: string | undefined): string | undefined {
  for (const part of (header ?? "").split(";")) {
    const eq = part.indexOf("=");
    const name = part.slice(0, eq).trim();
    if (eq > 0 && (name === SESSION_COOKIE || name === SECURE_SESSION_COOKIE)) return part.slice(eq + 1).trim();
  }
  return undefined;
}

/** The Set-Cookie that holds a session, or clears it (`id` undefined). */
export function sessionSetCookie(id: string | undefined, secure: boolean, maxAgeS: number): string {
  const name = secure ? SECURE_SESSION_COOKIE : SESSION_COOKIE;
  return [
    `${name}=${id ?? ""}`,
    "HttpOnly",
    "SameSite=Strict",
    "Path=/",
    `Max-Age=${id === undefined ? 0 : maxAgeS}`,
    ...(secure ? ["Secure"] : []),
  ].join("; ");
}

export class UiSessions {
  /** The session each request was let in by, for the session routes (sign-out, the CSRF token again). */
  private readonly byRequest = new WeakMap<IncomingMessage, SessionCheck>();

  constructor(
    private readonly ledger: LedgerStore,
    private readonly ring: KeyRing,
    readonly ttlMs = SESSION_TTL_MS,
  ) {}

  /** A new session acting as `keyId`. Expired and revoked keys' sessions are pruned on the way. */
  async create(keyId: string, now = Date.now()): Promise<{ id: string; csrf: string; expiresAt: string }> {
    await this.ledger.sessions.prune(new Date(now).toISOString());
    const id = randomBytes(32).toString("base64url");
    const expiresAt = new Date(now + this.ttlMs).toISOString();
    await this.ledger.sessions.insert({
      digest: sha256(id),
      key_id: keyId,
      created_at: new Date(now).toISOString(),
      expires_at: expiresAt,
    });
    return { id, csrf: csrfOf(id), expiresAt };
  }

  /** The session of an id while it and its key are current; undefined for anything else. */
  async check(id: string, now = Date.now()): Promise<SessionCheck | undefined> {
    if (!SESSION_ID_RE.test(id)) return undefined;
    const digest = sha256(id);
    const row = await this.ledger.sessions.get(digest);
    if (!row) return undefined;
    const principal = Date.parse(row.expires_at) > now ? await this.ring.holder(row.key_id, now) : undefined;
    if (!principal) {
      await this.ledger.sessions.remove(digest);
      return undefined;
    }
    return { principal, csrf: csrfOf(id), id, expiresAt: row.expires_at };
  }

  /** Ends a session (sign-out). */
  async end(id: string): Promise<void> {
    await this.ledger.sessions.remove(sha256(id));
  }

  remember(req: IncomingMessage, session: SessionCheck): void {
    this.byRequest.set(req, session);
  }

  /** The session a request was authenticated by, if it came with the cookie. */
  of(req: IncomingMessage): SessionCheck | undefined {
    return this.byRequest.get(req);
  }
}
