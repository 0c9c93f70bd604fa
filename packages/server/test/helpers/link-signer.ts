import { KeyBindings } from "../../src/auth/key-bindings.ts";
import { KeyRing } from "../../src/auth/key-ring.ts";
import { LinkTokens, type LinkPayload } from "../../src/auth/link-tokens.ts";
import type { TestServer } from "./test-server.ts";

/**
 * Signs link tokens as a test server does, made by `key` (default: its admin key), to forge ones
 * a route would not give (already expired, say) from the server's own link key.
 */
export async function linkSigner(
  ts: TestServer,
  key: string = ts.apiKey,
): Promise<(link: Omit<LinkPayload, "by">) => string> {
  const ring = await KeyRing.open(ts.home, ts.server.ledger);
  const check = await ring.verify(key);
  if (!check.ok) throw new Error(`the signing key does not verify: ${check.reason}`);
  const tokens = await LinkTokens.load(ts.home, new KeyBindings(ring, ts.server.ledger, ts.config.auth.mode));
  return (link) => tokens.sign(link, check.principal);
}
