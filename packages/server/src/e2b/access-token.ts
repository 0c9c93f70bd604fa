import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";

/**
 * envd access tokens: each sandbox's token is an HMAC of its id under a key kept in BOTHY_HOME,
 * so tokens survive a server restart without being stored, and no token is ever logged.
 */
export class AccessTokens {
  private constructor(private readonly key: Buffer) {}

  static async load(home: string): Promise<AccessTokens> {
    const path = join(home, "e2b-token.key");
    try {
      return new AccessTokens(await readFile(path));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
    }
    const key = randomBytes(32);
    // "wx": two servers on one home must not each write their own key.
    await writeFile(path, key, { mode: 0o600, flag: "wx" });
    return new AccessTokens(key);
  }

  tokenFor(sandboxId: string): string {
    return createHmac("sha256", this.key).update(sandboxId).digest("base64url");
  }

  verify(sandboxId: string, token: string | undefined): boolean {
    return token !== undefined && same(this.tokenFor(sandboxId), token);
  }

  /**
   * Whether `signature` signs this file operation for the sandbox, as the SDK's uploadUrl and
   * downloadUrl compute it from the access token: `v1_` + unpadded base64 of
   * sha256("path:operation:user:token[:expiration]").
   */
  verifySignature(sandboxId: string, op: SignedOperation, signature: string): boolean {
    const parts = [op.path, op.operation, op.user ?? "", this.tokenFor(sandboxId)];
    if (op.expiration !== undefined) parts.push(op.expiration);
    const digest = createHash("sha256").update(parts.join(":")).digest("base64").replace(/=+$/, "");
    return same(`v1_${digest}`, signature);
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
