/**
 * One-time sign-in links for the dashboard (`bothy ui-link`). A link carries a random token, never
 * the key; the ledger keeps only a digest of it beside the key it signs in as, in the sessions'
 * own table under a digest of its own domain (so a link's token is never a session id, nor a
 * session id a link). Redeeming deletes the row first and goes on only if this call deleted it:
 * a link signs in once. It is refused once expired, and when its key is revoked or expired
 * (read at redemption, as a session's key is on every request).
 */
import { createHash, randomBytes } from "node:crypto";
import { UI_LINK_TOKEN_RE } from "@bothy/protocol";
import type { LedgerStore } from "../ledger/store.ts";
import type { KeyRing, Principal } from "./key-ring.ts";

/** SHA-256 of a link token, apart from session ids' digests by its prefix. */
const linkDigest = (token: string): string => createHash("sha256").update(`bothy-ui-link:${token}`).digest("hex");

export class UiLinks {
  constructor(
    private readonly ledger: LedgerStore,
    private readonly ring: KeyRing,
  ) {}

  /** A new link for `keyId`, valid `ttlMs` from `now`: its token (shown once) and expiry. */
  async mint(keyId: string, ttlMs: number, now = Date.now()): Promise<{ token: string; expiresAt: string }> {
    await this.ledger.sessions.prune(new Date(now).toISOString());
    const token = randomBytes(32).toString("base64url");
    const expiresAt = new Date(now + ttlMs).toISOString();
    await this.ledger.sessions.insert({
      digest: linkDigest(token),
      key_id: keyId,
      created_at: new Date(now).toISOString(),
      expires_at: expiresAt,
    });
    return { token, expiresAt };
  }

  /** The key a link signs in as, once: undefined for an unknown, used or expired link, or a key no longer valid. */
  async redeem(token: string, now = Date.now()): Promise<Principal | undefined> {
    if (!UI_LINK_TOKEN_RE.test(token)) return undefined;
    const digest = linkDigest(token);
    const row = await this.ledger.sessions.get(digest);
    // Whoever deletes the row holds the one use; a second redemption finds nothing.
    if (!row || !(await this.ledger.sessions.remove(digest))) return undefined;
    if (Date.parse(row.expires_at) <= now) return undefined;
    return this.ring.holder(row.key_id, now);
  }
}
