import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import type { SandboxInfo } from "@bothy/protocol";
import { KeyBindings } from "../src/auth/key-bindings.ts";
import { KeyRing, NO_AUTH_PRINCIPAL } from "../src/auth/key-ring.ts";
import type { Scope } from "../src/auth/scopes.ts";
import { AccessTokens } from "../src/e2b/access-token.ts";
import { openStore } from "../src/ledger/store.ts";
import type { IncomingMessage } from "node:http";
import { getSignature } from "e2b";
import { metadataFilter } from "../src/e2b/control-plane.ts";
import { e2bPortRewrite } from "../src/e2b/port-rewrite.ts";
import { parseProbe } from "../src/e2b/sandbox-metrics.ts";
import { insertTestSandbox } from "./helpers/ledger-rows.ts";

describe("E2B list metadata filter", () => {
  const withMetadata = (metadata: Record<string, string>) => ({ metadata }) as SandboxInfo;

  it("decodes the SDK's doubly encoded form (a key and value with spaces, & and =)", async () => {
    // What reaches the route after the query string is decoded once, for {"a b": "c d&e=f"}.
    const filter = metadataFilter("a%2520b=c%2520d%2526e%253Df");
    expect(filter(withMetadata({ "a b": "c d&e=f" }))).toBe(true);
    expect(filter(withMetadata({ "a b": "c d" }))).toBe(false);
  });

  it("needs every pair to match; no filter matches everything", async () => {
    const filter = metadataFilter("x=1&y=2");
    expect(filter(withMetadata({ x: "1", y: "2", z: "3" }))).toBe(true);
    expect(filter(withMetadata({ x: "1" }))).toBe(false);
    expect(metadataFilter(undefined)(withMetadata({}))).toBe(true);
  });
});

/** A key ring, bindings and access tokens on a real ledger, with sandboxes in tenants `default` and `a`. */
async function tokenWorld(mode: "keys" | "none" = "keys") {
  const home = await mkdtemp(join(tmpdir(), "bothy-e2b-unit-"));
  const ledger = await openStore({ sqlitePath: join(home, "ledger.sqlite") });
  await ledger.auth.insertTenant("a", "{}");
  for (const [id, tenant] of [
    [SBX_A, "default"],
    [SBX_B, "default"],
    [SBX_OTHER, "a"],
  ] as const)
    insertTestSandbox(ledger, { id, driver: "gvisor", acceleration: null, tenant });
  const ring = await KeyRing.open(home, ledger);
  const bindings = new KeyBindings(ring, ledger, mode);
  const tokens = await AccessTokens.load(home, bindings);
  const principal = async (spec: { scopes: Scope[]; expiresAt?: string; tenant?: string }) => {
    const { key, view } = await ring.mint({
      tenant: spec.tenant ?? "default",
      name: "k",
      scopes: spec.scopes,
      expiresAt: spec.expiresAt ?? null,
    });
    const check = await ring.verify(key);
    if (!check.ok) throw new Error(check.reason);
    return { principal: check.principal, keyId: view.key_id };
  };
  return {
    home,
    ledger,
    ring,
    bindings,
    tokens,
    principal,
    close: async () => {
      await ledger.close();
      await rm(home, { recursive: true, force: true });
    },
  };
}

const SBX_A = "sbx_aaaaaaaaaaaaaaaaaaaa";
const SBX_B = "sbx_bbbbbbbbbbbbbbbbbbbb";
const SBX_OTHER = "sbx_cccccccccccccccccccc";

describe("envd access tokens", () => {
  it("are per sandbox and key, survive a reload of the key file, and refuse anything else", async () => {
    const w = await tokenWorld();
    try {
      const { principal } = await w.principal({ scopes: ["sandboxes:write"] });
      const token = w.tokens.tokenFor(SBX_A, principal);
      expect(w.tokens.tokenFor(SBX_B, principal)).not.toBe(token);
      expect(await w.tokens.verify(SBX_A, token)).toBe(true);
      expect(await w.tokens.verify(SBX_B, token)).toBe(false);
      expect(await w.tokens.verify(SBX_A, undefined)).toBe(false);
      expect(await w.tokens.verify(SBX_A, token.slice(1))).toBe(false);
      expect(await w.tokens.verify(SBX_A, `${token}.x`)).toBe(false);
      // The traffic token is another token: neither passes as the other's.
      const traffic = w.tokens.trafficTokenFor(SBX_A, principal);
      expect(await w.tokens.verify(SBX_A, traffic)).toBe(false);
      expect(await w.tokens.verifyTraffic(SBX_A, traffic, undefined)).toBe(true);
      expect(await w.tokens.verifyTraffic(SBX_A, undefined, token)).toBe(true);
      expect(await w.tokens.verifyTraffic(SBX_B, traffic, undefined)).toBe(false);
      expect(await (await AccessTokens.load(w.home, w.bindings)).verify(SBX_A, token)).toBe(true);
    } finally {
      await w.close();
    }
  });

  it("name the key that asked: another key's id swapped in does not verify", async () => {
    const w = await tokenWorld();
    try {
      const mine = await w.principal({ scopes: ["sandboxes:write"] });
      const theirs = await w.principal({ scopes: ["admin"] });
      const token = w.tokens.tokenFor(SBX_A, mine.principal);
      const [v, , mac] = token.split(".");
      const swapped = `${v}.${Buffer.from(theirs.keyId).toString("base64url")}.${mac}`;
      expect(await w.tokens.verify(SBX_A, swapped)).toBe(false);
    } finally {
      await w.close();
    }
  });

  it("stop working once their key is revoked or expires, or if it may not run commands there", async () => {
    const w = await tokenWorld();
    try {
      const revoked = await w.principal({ scopes: ["sandboxes:write"] });
      const token = w.tokens.tokenFor(SBX_A, revoked.principal);
      const traffic = w.tokens.trafficTokenFor(SBX_A, revoked.principal);
      expect(await w.tokens.verify(SBX_A, token)).toBe(true);
      await w.ring.revoke(revoked.keyId);
      expect(await w.tokens.verify(SBX_A, token)).toBe(false);
      expect(await w.tokens.verifyTraffic(SBX_A, traffic, token)).toBe(false);

      const until = Date.now() + 3_600_000;
      const expiring = await w.principal({ scopes: ["sandboxes:write"], expiresAt: new Date(until).toISOString() });
      const timed = w.tokens.tokenFor(SBX_A, expiring.principal);
      expect(await w.tokens.verify(SBX_A, timed, until - 1000)).toBe(true);
      expect(await w.tokens.verify(SBX_A, timed, until)).toBe(false);
      expect(await w.tokens.verify(SBX_A, timed, until + 1000)).toBe(false);

      // A read-only key's token (were one made) runs nothing; another tenant's key none of a's sandboxes.
      const reader = await w.principal({ scopes: ["sandboxes:read"] });
      expect(await w.tokens.verify(SBX_A, w.tokens.tokenFor(SBX_A, reader.principal))).toBe(false);
      const stranger = await w.principal({ scopes: ["sandboxes:write"], tenant: "a" });
      expect(await w.tokens.verify(SBX_A, w.tokens.tokenFor(SBX_A, stranger.principal))).toBe(false);
      expect(await w.tokens.verify(SBX_OTHER, w.tokens.tokenFor(SBX_OTHER, stranger.principal))).toBe(true);
    } finally {
      await w.close();
    }
  });

  it("made without authentication are refused once the server runs with keys", async () => {
    const open = await tokenWorld("none");
    try {
      const token = open.tokens.tokenFor(SBX_A, NO_AUTH_PRINCIPAL);
      expect(await open.tokens.verify(SBX_A, token)).toBe(true);
      const keyed = await AccessTokens.load(open.home, new KeyBindings(open.ring, open.ledger, "keys"));
      expect(await keyed.verify(SBX_A, token)).toBe(false);
    } finally {
      await open.close();
    }
  });

  it("refuse to start on a key file shorter than 32 bytes", async () => {
    const w = await tokenWorld();
    try {
      await writeFile(join(w.home, "e2b-token.key"), randomBytes(16));
      await expect(AccessTokens.load(w.home, w.bindings)).rejects.toThrow(/holds 16 bytes; an envd token key is 32/);
    } finally {
      await w.close();
    }
  });
});

describe("signed file URLs", () => {
  it("verify the signature the e2b SDK computes, for that path, operation, user and expiry only", async () => {
    const w = await tokenWorld();
    try {
      const { principal, keyId } = await w.principal({ scopes: ["sandboxes:write"] });
      const envdAccessToken = w.tokens.tokenFor(SBX_A, principal);
      const op = { path: "/tmp/x", operation: "read" as const, user: undefined, expiration: undefined };
      const { signature } = await getSignature({ ...op, envdAccessToken });
      const all = [SBX_B, SBX_A, SBX_OTHER];
      expect(await w.tokens.signerOf(all, op, signature)).toBe(SBX_A);
      expect(await w.tokens.signerOf([SBX_B, SBX_OTHER], op, signature)).toBeUndefined();
      expect(await w.tokens.signerOf(all, { ...op, operation: "write" }, signature)).toBeUndefined();
      expect(await w.tokens.signerOf(all, { ...op, path: "/tmp/y" }, signature)).toBeUndefined();
      expect(await w.tokens.signerOf(all, { ...op, user: "root" }, signature)).toBeUndefined();
      const timed = await getSignature({ ...op, envdAccessToken, expirationInSeconds: 60 });
      const expiration = String(timed.expiration);
      expect(await w.tokens.signerOf(all, { ...op, expiration }, timed.signature)).toBe(SBX_A);
      expect(await w.tokens.signerOf(all, { ...op, expiration: "1" }, timed.signature)).toBeUndefined();
      // A URL signed with a revoked key's token opens nothing.
      await w.ring.revoke(keyId);
      expect(await w.tokens.signerOf(all, op, signature)).toBeUndefined();
    } finally {
      await w.close();
    }
  });
});

describe("E2b-Sandbox-Port routing", () => {
  const id = "sbx_abcdefghijklmnopqrst";
  const req = (url: string, headers: Record<string, string>) => ({ url, headers }) as unknown as IncomingMessage;

  it("sends another port to bothy's port proxy and leaves envd's own port, and the rest, alone", async () => {
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
  it("reads CPU use between two /proc/stat lines, memory from meminfo and the disk from df", async () => {
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
