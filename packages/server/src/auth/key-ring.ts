/**
 * API keys: `bothy_` and 32 random bytes in hex. The ledger keeps only an HMAC-SHA256 of each
 * key under a pepper that lives in `$BOTHY_HOME/secrets/pepper` (0600), so a copy of the ledger
 * alone verifies nothing; plus a prefix and the last 4 characters to tell keys apart.
 */
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { chmod, mkdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { BothyError } from "@bothy/protocol";
import { DEFAULT_TENANT } from "../ledger/ledger.ts";
import type { LedgerStore } from "../ledger/store.ts";
import type { ApiKeyRow } from "../ledger/auth-rows.ts";
import { newKeyId } from "../util/ids.ts";
import { ALL_SCOPES, type Scope } from "./scopes.ts";

export const KEY_RE = /^bothy_[0-9a-f]{64}$/;
const PREFIX_CHARS = 10;
/** last_used_at is written at most this often per key (it would otherwise be a write per request). */
const TOUCH_EVERY_MS = 60_000;

export interface Principal {
  /** Null when authentication is off (BOTHY_AUTH=none). */
  keyId: string | null;
  tenant: string;
  scopes: ReadonlySet<Scope>;
}

export type KeyCheck = { ok: true; principal: Principal } | { ok: false; reason: string };

/** What the API shows of a key: never the key, nor its digest. */
export interface KeyView {
  key_id: string;
  tenant: string;
  name: string;
  display: string;
  scopes: Scope[];
  created_at: string;
  expires_at: string | null;
  revoked_at: string | null;
  last_used_at: string | null;
}

export function keyView(row: ApiKeyRow): KeyView {
  return {
    key_id: row.id,
    tenant: row.tenant,
    name: row.name,
    display: `${row.prefix}…${row.last4}`,
    scopes: row.scopes.split(",").filter(Boolean) as Scope[],
    created_at: row.created_at,
    expires_at: row.expires_at,
    revoked_at: row.revoked_at,
    last_used_at: row.last_used_at,
  };
}

/**
 * The pepper, made on first start. Refuses to make a new one for a ledger that has keys: none would
 * verify. (On a database several nodes share, the pepper is the cluster's, given to `open`.)
 */
async function loadPepper(home: string, ledger: LedgerStore): Promise<Buffer> {
  const dir = join(home, "secrets");
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await chmod(dir, 0o700);
  const file = join(dir, "pepper");
  try {
    const keys = await ledger.auth.countKeys();
    if (keys > 0) await readFile(file);
    else await writeFile(file, randomBytes(32), { mode: 0o600, flag: "wx" });
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT")
      throw new Error(
        `${file} is missing but the ledger holds API keys made with it: restore it from a backup (no key verifies without it), or move ledger.sqlite's keys away by starting on a fresh BOTHY_HOME.`,
      );
    if (code !== "EEXIST") throw err;
  }
  const pepper = await readFile(file);
  if (pepper.length < 32) throw new Error(`${file} holds ${pepper.length} bytes; a pepper is 32 random bytes.`);
  return pepper;
}

export class KeyRing {
  /**
   * Verified keys by digest: a request costs one HMAC, not a ledger read. Dropped on revoke. Only
   * on a ledger this process alone writes (SQLite): on a database several nodes share, a key
   * revoked through another node must be refused here from the next request, so each request
   * reads the key's row.
   */
  private readonly cache = new Map<string, ApiKeyRow>();
  private readonly caches: boolean;
  private readonly touched = new Map<string, number>();
  /** Counts revocations: a key read from the ledger while one landed is read again before it is cached. */
  private revocations = 0;
  /** Keys the server's own agent tools call the API with, one per tenant: in memory only, never stored. */
  private readonly service = new Map<string, Principal>();
  private readonly serviceKeys = new Map<string, string>();
  /** Names this process in what service principals' tokens are bound to: they end with it, as their keys do. */
  private readonly processMark = randomBytes(8).toString("hex");

  private constructor(
    private readonly ledger: LedgerStore,
    private readonly pepper: Buffer,
  ) {
    this.caches = ledger.dialect === "sqlite";
  }

  /**
   * `pepper`: the cluster's, on a database several nodes share (every node must digest a key the
   * same way); else the home's own file.
   */
  static async open(home: string, ledger: LedgerStore, pepper?: Buffer): Promise<KeyRing> {
    return new KeyRing(ledger, pepper ?? (await loadPepper(home, ledger)));
  }

  private digest(key: string): string {
    return createHmac("sha256", this.pepper).update(key).digest("hex");
  }

  /**
   * On a ledger with no keys yet: mints the `default` tenant's admin key (BOTHY_ADMIN_KEY's value
   * when set) and writes it once to `$BOTHY_HOME/admin.key` (0600). Answers the key's id, or undefined.
   */
  async bootstrap(home: string, given: string | undefined): Promise<string | undefined> {
    if ((await this.ledger.auth.countKeys()) > 0) return undefined;
    const { key, view } = await this.mint({
      tenant: DEFAULT_TENANT,
      name: "admin (bootstrap)",
      scopes: ["admin"],
      expiresAt: null,
      ...(given === undefined ? {} : { key: given }),
    });
    const file = join(home, "admin.key");
    await writeFile(file, `${key}\n`, { mode: 0o600 });
    await chmod(file, 0o600);
    return view.key_id;
  }

  async mint(spec: { tenant: string; name: string; scopes: Scope[]; expiresAt: string | null; key?: string }): Promise<{
    key: string;
    view: KeyView;
  }> {
    const key = spec.key ?? `bothy_${randomBytes(32).toString("hex")}`;
    const row: Omit<ApiKeyRow, "revoked_at" | "last_used_at"> = {
      id: newKeyId(),
      tenant: spec.tenant,
      name: spec.name,
      digest: this.digest(key),
      prefix: key.slice(0, PREFIX_CHARS),
      last4: key.slice(-4),
      scopes: [...new Set(spec.scopes)].sort().join(","),
      created_at: new Date().toISOString(),
      expires_at: spec.expiresAt,
    };
    await this.ledger.auth.insertKey(row);
    return { key, view: keyView({ ...row, revoked_at: null, last_used_at: null }) };
  }

  /**
   * The key a tenant's agent tools (MCP, conversations, PDF extraction) reach sandboxes with:
   * that tenant's sandboxes and files only. It lives in this process's memory and dies with it.
   */
  serviceKey(tenant: string): string {
    const known = this.serviceKeys.get(tenant);
    if (known) return known;
    const key = `bothy_${randomBytes(32).toString("hex")}`;
    this.service.set(this.digest(key), {
      keyId: null,
      tenant,
      scopes: new Set<Scope>(["sandboxes:read", "sandboxes:write", "files"]),
    });
    this.serviceKeys.set(tenant, key);
    return key;
  }

  /** Checks a presented key. The reasons are for the server's log; a client is told only "not valid". */
  async verify(presented: string, now = Date.now()): Promise<KeyCheck> {
    if (!KEY_RE.test(presented)) return { ok: false, reason: "malformed" };
    const digest = this.digest(presented);
    const service = this.service.get(digest);
    if (service) return { ok: true, principal: service };
    let row = this.caches ? this.cache.get(digest) : undefined;
    for (let seen = -1; row === undefined && seen !== this.revocations;) {
      seen = this.revocations;
      row = await this.ledger.auth.keyByDigest(digest);
      // A revocation landed during the read: what it read may be the key before it, so read again.
      if (seen !== this.revocations) row = undefined;
    }
    // The lookup is by digest; comparing it again in constant time keeps the check itself timing-safe.
    if (!row || !timingSafeEqual(Buffer.from(row.digest, "hex"), Buffer.from(digest, "hex")))
      return { ok: false, reason: "unknown" };
    if (row.revoked_at !== null) return { ok: false, reason: "revoked" };
    if (row.expires_at !== null && Date.parse(row.expires_at) <= now) return { ok: false, reason: "expired" };
    if (this.caches) this.cache.set(digest, row);
    const last = this.touched.get(row.id) ?? 0;
    if (now - last >= TOUCH_EVERY_MS) {
      this.touched.set(row.id, now);
      // A last-use time that failed to land is written by the next use after TOUCH_EVERY_MS.
      this.ledger.auth.touchKey(row.id, new Date(now).toISOString()).catch(() => this.touched.delete(row.id));
    }
    return { ok: true, principal: principalOfRow(row) };
  }

  /**
   * The principal of a key id while that key is current (not revoked, not expired). It reads the
   * ledger on each call, so tokens bound to a key end from the next use after its revocation.
   */
  async holder(keyId: string, now = Date.now()): Promise<Principal | undefined> {
    const row = await this.ledger.auth.key(keyId);
    if (!row || row.revoked_at !== null) return undefined;
    if (row.expires_at !== null && Date.parse(row.expires_at) <= now) return undefined;
    return principalOfRow(row);
  }

  /** Every current key's principal (for checking which of them signed something). */
  async holders(now = Date.now()): Promise<Principal[]> {
    return (await this.ledger.auth.keys())
      .filter((row) => row.revoked_at === null && (row.expires_at === null || Date.parse(row.expires_at) > now))
      .map(principalOfRow);
  }

  /** What a token made for one of this process's service principals is bound to; undefined for any other principal. */
  serviceBinding(principal: Principal): string | undefined {
    for (const service of this.service.values()) if (service === principal) return this.serviceName(principal.tenant);
    return undefined;
  }

  /** The service principal a binding names, while this process (which made it) runs. */
  serviceHolder(binding: string): Principal | undefined {
    for (const service of this.service.values()) if (this.serviceName(service.tenant) === binding) return service;
    return undefined;
  }

  /** The service bindings of this process (for checking which of them signed something). */
  serviceBindings(): Array<{ binding: string; principal: Principal }> {
    return [...this.service.values()].map((principal) => ({ binding: this.serviceName(principal.tenant), principal }));
  }

  private serviceName(tenant: string): string {
    return `svc.${this.processMark}.${tenant}`;
  }

  /** Revokes a key; it is refused from the next request on. False when it was revoked already. */
  async revoke(id: string): Promise<boolean> {
    const row = await this.ledger.auth.key(id);
    if (!row) throw new BothyError("key_not_found", `No API key ${id.slice(0, 64)}; GET /keys lists them.`);
    const changed = await this.ledger.auth.revokeKey(id);
    // Once the revocation is in the ledger: a verify reading meanwhile reads again (`revocations`).
    this.revocations++;
    this.cache.delete(row.digest);
    return changed;
  }
}

function principalOfRow(row: ApiKeyRow): Principal {
  return { keyId: row.id, tenant: row.tenant, scopes: new Set(row.scopes.split(",") as Scope[]) };
}

/** The principal when authentication is off: everything, in the default tenant. */
export const NO_AUTH_PRINCIPAL: Principal = { keyId: null, tenant: DEFAULT_TENANT, scopes: new Set(ALL_SCOPES) };
