import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
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
    if (token === undefined) return false;
    const expected = Buffer.from(this.tokenFor(sandboxId));
    const given = Buffer.from(token);
    return given.length === expected.length && timingSafeEqual(given, expected);
  }
}
