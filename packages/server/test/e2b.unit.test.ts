import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import type { SandboxInfo } from "@bothy/protocol";
import { AccessTokens } from "../src/e2b/access-token.ts";
import { metadataFilter } from "../src/e2b/control-plane.ts";

describe("E2B list metadata filter", () => {
  const withMetadata = (metadata: Record<string, string>) => ({ metadata }) as SandboxInfo;

  it("decodes the SDK's doubly encoded form (a key and value with spaces, & and =)", () => {
    // What reaches the route after the query string is decoded once, for {"a b": "c d&e=f"}.
    const filter = metadataFilter("a%2520b=c%2520d%2526e%253Df");
    expect(filter(withMetadata({ "a b": "c d&e=f" }))).toBe(true);
    expect(filter(withMetadata({ "a b": "c d" }))).toBe(false);
  });

  it("needs every pair to match; no filter matches everything", () => {
    const filter = metadataFilter("x=1&y=2");
    expect(filter(withMetadata({ x: "1", y: "2", z: "3" }))).toBe(true);
    expect(filter(withMetadata({ x: "1" }))).toBe(false);
    expect(metadataFilter(undefined)(withMetadata({}))).toBe(true);
  });
});

describe("envd access tokens", () => {
  it("are per sandbox, survive a reload of the key, and refuse anything else", async () => {
    const home = await mkdtemp(join(tmpdir(), "bothy-e2b-unit-"));
    try {
      const tokens = await AccessTokens.load(home);
      const token = tokens.tokenFor("sbx_a");
      expect(tokens.tokenFor("sbx_b")).not.toBe(token);
      expect(tokens.verify("sbx_a", token)).toBe(true);
      expect(tokens.verify("sbx_b", token)).toBe(false);
      expect(tokens.verify("sbx_a", undefined)).toBe(false);
      expect(tokens.verify("sbx_a", token.slice(1))).toBe(false);
      expect((await AccessTokens.load(home)).verify("sbx_a", token)).toBe(true);
    } finally {
      await rm(home, { recursive: true, force: true });
    }
  });
});
