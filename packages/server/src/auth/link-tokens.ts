/**
 * Links a person opens in a browser without an API key: the desktop's live view and a port's
 * URL. A link token is `base64url(payload).base64url(HMAC-SHA256(payload))` under a key of its
 * own in `$BOTHY_HOME/secrets/link-key` (0600; replacing that file voids every link), and names
 * one sandbox, one purpose (`desktop` or `port:N`), whether it gives control, its expiry and the
 * key that made it (`by`, auth/key-bindings.ts): a link works only while that key is current and
 * may still do what the link does, so revoking the key, or its expiry, ends its links.
 * Tokens are never stored, logged or passed into a guest.
 */
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { chmod, mkdir, readFile, writeFile } from "node:fs/promises";
import type { IncomingMessage } from "node:http";
import { join } from "node:path";
import type { FastifyRequest } from "fastify";
import { z } from "zod";
import { SANDBOX_ID_RE } from "@bothy/protocol";
import type { KeyBindings } from "./key-bindings.ts";
import type { Principal } from "./key-ring.ts";
import type { Scope } from "./scopes.ts";

/** The cookie a port link leaves behind, so the app's own relative links keep working. */
export const LINK_COOKIE = "bothy_link";

const payloadSchema = z.object({
  sid: z.string().regex(SANDBOX_ID_RE),
  what: z.union([z.literal("desktop"), z.string().regex(/^port:[0-9]{1,5}$/)]),
  control: z.boolean().optional(),
  exp: z.number().int(),
  by: z.string().min(1).max(200),
});
export type LinkPayload = z.infer<typeof payloadSchema>;

/**
 * Requests let in by a port link's `?token=` in their URL (not its cookie), with the token's
 * expiry: the port proxy strips the token and sets the cookie.
 */
const byQuery = new WeakMap<IncomingMessage, { token: string; exp: number }>();
function markTokenInQuery(req: IncomingMessage, token: string, exp: number): void {
  byQuery.set(req, { token, exp });
}
export function tokenInQuery(req: IncomingMessage): { token: string; exp: number } | undefined {
  return byQuery.get(req);
}

/**
 * Requests let in by a port link's cookie, which a browser attaches by itself: the port proxy
 * checks their Origin (api/port-origin.ts).
 */
const byCookie = new WeakSet<IncomingMessage>();
export function linkedByCookie(req: IncomingMessage): boolean {
  return byCookie.has(req);
}

/** A URL with the value of any `token` parameter replaced, for logs. */
export function redactToken(url: string): string {
  return url.replace(/([?&]token=)[^&#]*/g, "$1[redacted]");
}

/** A URL (path and query) without its `token` parameters. */
export function withoutToken(url: string): string {
  const q = url.indexOf("?");
  if (q < 0) return url;
  const kept = url
    .slice(q + 1)
    .split("&")
    .filter((part) => part !== "" && part.split("=")[0] !== "token");
  return kept.length === 0 ? url.slice(0, q) : `${url.slice(0, q)}?${kept.join("&")}`;
}

/** The link token of a Cookie header, if any. */
export function linkCookie(header: string | undefined): string | undefined {
  for (const part of (header ?? "").split(";")) {
    const eq = part.indexOf("=");
    if (eq > 0 && part.slice(0, eq).trim() === LINK_COOKIE) return part.slice(eq + 1).trim();
  }
  return undefined;
}

/** What a link lets its holder do: a desktop link watch (and with control, use) the screen; a port link use the port. */
function scopesOf(payload: LinkPayload): Scope[] {
  if (payload.what !== "desktop") return ["sandboxes:write"];
  return payload.control ? ["sandboxes:read", "sandboxes:write"] : ["sandboxes:read"];
}

export class LinkTokens {
  private constructor(
    private readonly key: Buffer,
    private readonly bindings: KeyBindings,
  ) {}

  /** `key`: the cluster's, on a database several nodes share (a link made on one opens on all); else the home's file. */
  static async load(home: string, bindings: KeyBindings, given?: Buffer): Promise<LinkTokens> {
    if (given) return new LinkTokens(given, bindings);
    const dir = join(home, "secrets");
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await chmod(dir, 0o700);
    const file = join(dir, "link-key");
    await writeFile(file, randomBytes(32), { mode: 0o600, flag: "wx" }).catch((err: unknown) => {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    });
    const key = await readFile(file);
    if (key.length < 32) throw new Error(`${file} holds ${key.length} bytes; a link key is 32 random bytes.`);
    return new LinkTokens(key, bindings);
  }

  private mac(body: string): Buffer {
    return createHmac("sha256", this.key).update(`bothy-link-v1.${body}`).digest();
  }

  /** A link made by `principal` (the route has checked it may do what the link does). */
  sign(link: Omit<LinkPayload, "by">, principal: Principal): string {
    return this.signAs(link, this.bindings.of(principal));
  }

  /** A link made under a key binding a token of another kind carried (an E2B envd token's). */
  signAs(link: Omit<LinkPayload, "by">, by: string): string {
    const payload: LinkPayload = { ...link, by };
    const body = Buffer.from(JSON.stringify(payload)).toString("base64url");
    return `${body}.${this.mac(body).toString("base64url")}`;
  }

  /**
   * The payload of a token that is whole, signed here and not expired, whose key is current and
   * may still do what the link does in its sandbox; else undefined.
   */
  async verify(token: string | undefined, now = Date.now()): Promise<LinkPayload | undefined> {
    if (token === undefined || token.length > 1024) return undefined;
    const [body, sig, ...rest] = token.split(".");
    if (body === undefined || sig === undefined || rest.length > 0) return undefined;
    const given = Buffer.from(sig, "base64url");
    const expected = this.mac(body);
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) return undefined;
    let parsed: unknown;
    try {
      parsed = JSON.parse(Buffer.from(body, "base64url").toString("utf8"));
    } catch {
      return undefined;
    }
    const payload = payloadSchema.safeParse(parsed);
    if (!payload.success || payload.data.exp * 1000 <= now) return undefined;
    if (!(await this.bindings.holds(payload.data.by, payload.data.sid, scopesOf(payload.data), now))) return undefined;
    return payload.data;
  }
}

const PROXY_ROUTE = /^\/sandboxes\/:id\/ports\/:port(\/\*)?$/;
const DESKTOP_ROUTES = new Set(["/sandboxes/:id/desktop", "/sandboxes/:id/desktop/vnc"]);

/**
 * The grant of a link token (auth-hooks' SandboxGrant): a desktop token opens the viewer page and
 * its VNC WebSocket (sandboxes:read, view only; sandboxes:write too when it gives control); a port
 * token opens that one port's proxy, from `?token=` or the cookie the first request left.
 */
export function linkGrant(
  tokens: LinkTokens,
): (request: FastifyRequest, url: string) => Promise<{ sandbox: string; scopes: Scope[] } | undefined> {
  return async (request, url) => {
    const params = request.params as { id?: unknown; port?: unknown };
    const query = (request.query as { token?: unknown } | undefined)?.token;
    const inQuery = typeof query === "string" ? query : undefined;
    if (DESKTOP_ROUTES.has(url)) {
      const payload = await tokens.verify(inQuery);
      if (payload?.what !== "desktop" || payload.sid !== params.id) return undefined;
      return { sandbox: payload.sid, scopes: scopesOf(payload) };
    }
    if (!PROXY_ROUTE.test(url)) return undefined;
    const token = inQuery ?? linkCookie(request.headers.cookie);
    const payload = await tokens.verify(token);
    if (payload?.what !== `port:${String(params.port)}` || payload.sid !== params.id) return undefined;
    if (inQuery !== undefined) markTokenInQuery(request.raw, inQuery, payload.exp);
    else byCookie.add(request.raw);
    return { sandbox: payload.sid, scopes: scopesOf(payload) };
  };
}
