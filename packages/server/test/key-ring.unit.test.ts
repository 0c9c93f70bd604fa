/** The key ring against a real ledger: what is stored, what verifies, and the pepper's guard. */
import { mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { KeyBindings } from "../src/auth/key-bindings.ts";
import { KeyRing } from "../src/auth/key-ring.ts";
import { LinkTokens } from "../src/auth/link-tokens.ts";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { insertTestSandbox } from "./helpers/ledger-rows.ts";

let home: string;
let ledger: LedgerStore;

beforeEach(async () => {
  home = await mkdtemp(join(tmpdir(), "bothy-keys-"));
  ledger = await openStore({ sqlitePath: join(home, "ledger.sqlite") });
});

afterEach(async () => {
  await ledger.close();
  await rm(home, { recursive: true, force: true });
});

describe("key ring", () => {
  it("stores a digest, not the key, and verifies only the exact, current key", async () => {
    const ring = await KeyRing.open(home, ledger);
    const { key, view } = await ring.mint({ tenant: "default", name: "k", scopes: ["files"], expiresAt: null });
    expect(key).toMatch(/^bothy_[0-9a-f]{64}$/);
    const row = await ledger.auth.key(view.key_id);
    expect(row?.digest).toMatch(/^[0-9a-f]{64}$/);
    expect(JSON.stringify(row)).not.toContain(key.slice(6));
    expect(view.display).toBe(`${key.slice(0, 10)}…${key.slice(-4)}`);
    const ok = await ring.verify(key);
    expect(ok.ok && [ok.principal.tenant, [...ok.principal.scopes]]).toEqual(["default", ["files"]]);
    const altered = `${key.slice(0, 20)}${key[20] === "0" ? "1" : "0"}${key.slice(21)}`;
    expect(await ring.verify(altered)).toEqual({ ok: false, reason: "unknown" });
    expect(await ring.verify("bothy_x")).toEqual({ ok: false, reason: "malformed" });
    const expired = await ring.mint({
      tenant: "default",
      name: "e",
      scopes: ["files"],
      expiresAt: "2026-01-01T00:00:00Z",
    });
    expect(await ring.verify(expired.key)).toEqual({ ok: false, reason: "expired" });
    expect(await ring.revoke(view.key_id)).toBe(true);
    expect(await ring.verify(key)).toEqual({ ok: false, reason: "revoked" });
    expect(await ring.revoke(view.key_id)).toBe(false);
  });

  it("bootstraps one admin key into admin.key (0600), and only on a ledger without keys", async () => {
    const ring = await KeyRing.open(home, ledger);
    const id = await ring.bootstrap(home, undefined);
    expect(id).toMatch(/^key_/);
    const file = join(home, "admin.key");
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    expect((await stat(join(home, "secrets", "pepper"))).mode & 0o777).toBe(0o600);
    const key = (await readFile(file, "utf8")).trim();
    const check = await ring.verify(key);
    expect(check.ok && [...check.principal.scopes]).toEqual(["admin"]);
    expect(await ring.bootstrap(home, undefined)).toBeUndefined();
    expect((await readFile(file, "utf8")).trim()).toBe(key);
  });

  it("refuses to start with a new pepper when the ledger holds keys made with the old one", async () => {
    const ring = await KeyRing.open(home, ledger);
    await ring.bootstrap(home, undefined);
    await rm(join(home, "secrets", "pepper"));
    await expect(KeyRing.open(home, ledger)).rejects.toThrow(/pepper is missing but the ledger holds API keys/);
  });

  it("gives each tenant's tools a key of their own that is never stored", async () => {
    const ring = await KeyRing.open(home, ledger);
    const a = ring.serviceKey("a");
    expect(ring.serviceKey("a")).toBe(a);
    expect(ring.serviceKey("b")).not.toBe(a);
    const check = await ring.verify(a);
    expect(check.ok && check.principal.tenant).toBe("a");
    expect(await ledger.auth.countKeys()).toBe(0);
  });

  it("ends a key's link tokens when it is revoked or expires, and refuses links beyond what it may do", async () => {
    const ring = await KeyRing.open(home, ledger);
    const sid = "sbx_aaaaaaaaaaaaaaaaaaaa";
    await insertTestSandbox(ledger, { id: sid, driver: "gvisor", acceleration: null });
    const links = await LinkTokens.load(home, new KeyBindings(ring, ledger, "keys"));
    const principalOf = async (key: string) => {
      const check = await ring.verify(key);
      if (!check.ok) throw new Error(check.reason);
      return check.principal;
    };
    const exp = Math.floor(Date.now() / 1000) + 7200;
    const until = Date.now() + 3_600_000;
    const expiring = await ring.mint({
      tenant: "default",
      name: "e",
      scopes: ["sandboxes:write"],
      expiresAt: new Date(until).toISOString(),
    });
    const port = links.sign({ sid, what: "port:8000", exp }, await principalOf(expiring.key));
    expect((await links.verify(port, until - 1000))?.sid).toBe(sid);
    expect(await links.verify(port, until)).toBeUndefined();

    const revoked = await ring.mint({ tenant: "default", name: "r", scopes: ["sandboxes:read"], expiresAt: null });
    const view = links.sign({ sid, what: "desktop", exp }, await principalOf(revoked.key));
    expect((await links.verify(view))?.what).toBe("desktop");
    // A read-only key's link with control (were one signed) gives nothing.
    expect(
      await links.verify(links.sign({ sid, what: "desktop", control: true, exp }, await principalOf(revoked.key))),
    ).toBe(undefined);
    await ring.revoke(revoked.view.key_id);
    expect(await links.verify(view)).toBeUndefined();

    // The agent tools' in-memory key: its links work while this process (its ring) lives, not after.
    const tools = links.sign({ sid, what: "port:8000", exp }, await principalOf(ring.serviceKey("default")));
    expect((await links.verify(tools))?.sid).toBe(sid);
    const restarted = await LinkTokens.load(home, new KeyBindings(await KeyRing.open(home, ledger), ledger, "keys"));
    expect(await restarted.verify(tools)).toBeUndefined();
    expect((await restarted.verify(port, until - 1000))?.sid).toBe(sid);
  });
});
