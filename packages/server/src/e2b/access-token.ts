import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { KeyBindings } from "../auth/key-bindings.ts";
import type { Principal } from "../auth/key-ring.ts";
import type { Scope } from "../auth/scopes.ts";

/** What an envd or traffic token lets its holder do: start processes, reach every port. */
const RUN: readonly Scope[] = ["sandboxes:write"];
/** Far longer than any token (a binding is a key id, `none` or a short service name). */
const MAX_TOKEN_CHARS = 512;

type Purpose = "envd" | "traffic";

/**
 * envd and traffic access tokens, one per (sandbox, key that asked): `v2.` + base64url(binding) +
 * `.` + base64url(HMAC-SHA256 of purpose, sandbox id and binding) under a key kept in
 * `$BOTHY_HOME/e2b-token.key`. Nothing is stored, so tokens survive a restart; each use checks
 * the binding (auth/key-bindings.ts) is still a current key with `sandboxes:write` in the
 * sandbox's tenant. A token thus ends when its sandbox ends (ids are never reused), or its key
 * is revoked or expires, whichever comes first; it carries no expiry of its own because the e2b
 * SDK keeps one token per Sandbox object and signs file URLs with it (see `signerOf`).
 */
export class AccessTokens {
  private constructor(
    private readonly key: Buffer,
    private readonly bindings: KeyBindings,
  ) {}

  /** `given`: the cluster's, on a database several nodes share (a token made on one opens on all); else the home's file. */
  static async load(home: string, bindings: KeyBindings, given?: Buffer): Promise<AccessTokens> {
    if (given) return new AccessTokens(given, bindings);
    const path = join(home, "e2b-token.key");
    let key: Buffer;
    try {
      key = await readFile(path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
      key = randomBytes(32);
      // "wx": two servers on one home must not each write their own key.
      await writeFile(path, key, { mode: 0o600, flag: "wx" });
    }
    if (key.length < 32) throw new Error(`${path} holds ${key.length} bytes; an envd token key is 32 random bytes.`);
    return new AccessTokens(key, bindings);
  }

  private make(purpose: Purpose, sandboxId: string, binding: string): string {
    const body = Buffer.from(binding).toString("base64url");
    const mac = createHmac("sha256", this.key).update(`bothy-${purpose}-v2\0${sandboxId}\0${body}`);
    return `v2.${body}.${mac.digest("base64url")}`;
  }

  /** The binding of a token this server made for this purpose and sandbox; undefined for any other. */
  private bindingOf(purpose: Purpose, sandboxId: string, token: string | undefined): string | undefined {
    if (token === undefined || token.length > MAX_TOKEN_CHARS) return undefined;
    const [version, body, mac, ...rest] = token.split(".");
    if (version !== "v2" || body === undefined || mac === undefined || rest.length > 0) return undefined;
    const binding = Buffer.from(body, "base64url").toString("utf8");
    return same(this.make(purpose, sandboxId, binding), token) ? binding : undefined;
  }

  /** The envd token for a principal that may run commands in the sandbox (the caller checks it may). */
  tokenFor(sandboxId: string, principal: Principal): string {
    return this.make("envd", sandboxId, this.bindings.of(principal));
  }

  /** Whether `token` is this sandbox's envd token of a key that may still run commands there. */
  async verify(sandboxId: string, token: string | undefined, now = Date.now()): Promise<boolean> {
    const binding = this.bindingOf("envd", sandboxId, token);
    return binding !== undefined && (await this.bindings.holds(binding, sandboxId, RUN, now));
  }

  /** The key binding of this sandbox's envd token, when it is one this server made. */
  envdBinding(sandboxId: string, token: string | undefined): string | undefined {
    return this.bindingOf("envd", sandboxId, token);
  }

  /** The token E2B's SDKs send to the sandbox's other ports (`E2B-Traffic-Access-Token`). */
  trafficTokenFor(sandboxId: string, principal: Principal): string {
    return this.make("traffic", sandboxId, this.bindings.of(principal));
  }

  /** Whether a request to one of the sandbox's ports carries either of its tokens. */
  async verifyTraffic(
    sandboxId: string,
    traffic: string | undefined,
    envd: string | undefined,
    now = Date.now(),
  ): Promise<boolean> {
    const binding = this.bindingOf("traffic", sandboxId, traffic);
    if (binding !== undefined && (await this.bindings.holds(binding, sandboxId, RUN, now))) return true;
    return this.verify(sandboxId, envd, now);
  }

  /**
   * The sandbox among `sandboxIds` whose envd token of a current key signs this file operation,
   * as the SDK's uploadUrl and downloadUrl compute it from the token: `v1_` + unpadded base64 of
   * sha256("path:operation:user:token[:expiration]"). The signature does not name the token, so
   * every (sandbox, current key) pair that could hold one is tried.
   */
  async signerOf(
    sandboxIds: readonly string[],
    op: SignedOperation,
    signature: string,
    now = Date.now(),
  ): Promise<string | undefined> {
    for (const { sandboxId, binding } of await this.bindings.candidates(sandboxIds, RUN, now)) {
      const parts = [op.path, op.operation, op.user ?? "", this.make("envd", sandboxId, binding)];
      if (op.expiration !== undefined) parts.push(op.expiration);
      const digest = createHash("sha256").update(parts.join(":")).digest("base64").replace(/=+$/, "");
      if (same(`v1_${digest}`, signature)) return sandboxId;
    }
    return undefined;
  }
}

export interface SignedOperation {
  path: string;
  operation: "read" | "write";
  user: string | undefined;
  /** `signature_expiration` as sent (unix seconds). */
  expiration: string | undefined;
}

function same(expected: string, given: string): boolean {
  const a = Buffer.from(expected);
  const b = Buffer.from(given);
  return a.length === b.length && timingSafeEqual(a, b);
}
