import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import type { SandboxInfo } from "@bothy/protocol";
import { AccessTokens } from "../src/e2b/access-token.ts";
import type { IncomingMessage } from "node:http";
import { getSignature } from "e2b";
import { metadataFilter } from "../src/e2b/control-plane.ts";
import { e2bPortRewrite } from "../src/e2b/port-rewrite.ts";
import { parseProbe } from "../src/e2b/sandbox-metrics.ts";

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

describe("signed file URLs", () => {
  it("verify the signature the e2b SDK computes, for that path, operation, user and expiry only", async () => {
    const home = await mkdtemp(join(tmpdir(), "bothy-e2b-unit-"));
    try {
      const tokens = await AccessTokens.load(home);
      const envdAccessToken = tokens.tokenFor("sbx_a");
      const op = { path: "/tmp/x", operation: "read" as const, user: undefined, expiration: undefined };
      const { signature } = await getSignature({ ...op, envdAccessToken });
      expect(tokens.verifySignature("sbx_a", op, signature)).toBe(true);
      expect(tokens.verifySignature("sbx_b", op, signature)).toBe(false);
      expect(tokens.verifySignature("sbx_a", { ...op, operation: "write" }, signature)).toBe(false);
      expect(tokens.verifySignature("sbx_a", { ...op, path: "/tmp/y" }, signature)).toBe(false);
      expect(tokens.verifySignature("sbx_a", { ...op, user: "root" }, signature)).toBe(false);
      const timed = await getSignature({ ...op, envdAccessToken, expirationInSeconds: 60 });
      const expiration = String(timed.expiration);
      expect(tokens.verifySignature("sbx_a", { ...op, expiration }, timed.signature)).toBe(true);
      expect(tokens.verifySignature("sbx_a", { ...op, expiration: "1" }, timed.signature)).toBe(false);
    } finally {
      await rm(home, { recursive: true, force: true });
    }
  });
});

describe("E2b-Sandbox-Port routing", () => {
  const id = "sbx_abcdefghijklmnopqrst";
  const req = (url: string, headers: Record<string, string>) => ({ url, headers }) as unknown as IncomingMessage;

  it("sends another port to bothy's port proxy and leaves envd's own port, and the rest, alone", () => {
    const to = (port: string, url = "/e2b/envd/execute?a=1") =>
      e2bPortRewrite(req(url, { "e2b-sandbox-id": id, "e2b-sandbox-port": port }));
    expect(to("49999")).toBe(`/sandboxes/${id}/ports/49999/execute?a=1`);
    expect(to("8000", "/e2b/envd")).toBe(`/sandboxes/${id}/ports/8000/`);
    expect(to("8000", "/e2b/envd?x")).toBe(`/sandboxes/${id}/ports/8000/?x`);
    expect(to("49983")).toBeUndefined();
    expect(to("80a")).toBeUndefined();
    expect(to("8000", "/e2b/envdx/execute")).toBeUndefined();
    expect(to("8000", "/sandboxes")).toBeUndefined();
    expect(e2bPortRewrite(req("/e2b/envd/x", { "e2b-sandbox-id": "../x", "e2b-sandbox-port": "80" }))).toBeUndefined();
    expect(e2bPortRewrite(req("/e2b/envd/x", { "e2b-sandbox-port": "80" }))).toBeUndefined();
  });
});

describe("sandbox metrics probe", () => {
  it("reads CPU use between two /proc/stat lines, memory from meminfo and the disk from df", () => {
    const output = [
      "cpu  100 0 100 800 0 0 0 0 0 0",
      "cpu  150 0 150 900 0 0 0 0 0 0",
      "MemTotal:        1000 kB",
      "MemFree:          200 kB",
      "MemAvailable:     600 kB",
      "Cached:           100 kB",
      "none 2000 500 1500 25% /",
      "",
    ].join("\n");
    const now = new Date("2026-12-01T00:00:00Z");
    expect(parseProbe(output, 2, now)).toEqual({
      timestamp: "2026-12-01T00:00:00.000Z",
      timestampUnix: Math.floor(now.getTime() / 1000),
      cpuUsedPct: 50,
      cpuCount: 2,
      memUsed: 400 * 1024,
      memTotal: 1000 * 1024,
      memCache: 100 * 1024,
      diskUsed: 500 * 1024,
      diskTotal: 2000 * 1024,
    });
  });
});
