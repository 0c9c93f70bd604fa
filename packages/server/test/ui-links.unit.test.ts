/**
 * The dashboard's one-time sign-in links against a real ledger, from the side of whoever holds a
 * link that should no longer work: one already used, one past its time, one whose key was
 * revoked, and a token or session id presented as the other kind.
 */
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { KeyRing } from "../src/auth/key-ring.ts";
import { UiLinks } from "../src/auth/ui-links.ts";
import { UiSessions } from "../src/auth/ui-sessions.ts";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";

let home: string;
let ledger: LedgerStore;
let ring: KeyRing;
let links: UiLinks;
let sessions: UiSessions;
let keyId: string;
let key: string;

beforeEach(async () => {
  home = await mkdtemp(join(tmpdir(), "bothy-ui-links-"));
  ledger = await openStore({ sqlitePath: join(home, "ledger.sqlite") });
  ring = await KeyRing.open(home, ledger);
  const minted = await ring.mint({ tenant: "default", name: "k", scopes: ["sandboxes:read"], expiresAt: null });
  keyId = minted.view.key_id;
  key = minted.key;
  links = new UiLinks(ledger, ring);
  sessions = new UiSessions(ledger, ring);
});

afterEach(async () => {
  await ledger.close();
  await rm(home, { recursive: true, force: true });
});

const MINUTE = 60_000;

describe("dashboard sign-in links", () => {
  it("signs in once as its key; a second use is refused", async () => {
    const { token } = await links.mint(keyId, 5 * MINUTE);
    expect((await links.redeem(token))?.keyId).toBe(keyId);
    expect(await links.redeem(token)).toBeUndefined();
  });

  it("refuses a link past its time, and it stays dead", async () => {
    const now = Date.now();
    const { token, expiresAt } = await links.mint(keyId, 5 * MINUTE, now);
    expect(Date.parse(expiresAt)).toBe(now + 5 * MINUTE);
    expect(await links.redeem(token, now + 5 * MINUTE)).toBeUndefined();
    expect(await links.redeem(token, now)).toBeUndefined();
  });

  it("refuses a link whose key was revoked after it was made", async () => {
    const { token } = await links.mint(keyId, 5 * MINUTE);
    expect(await ring.revoke(keyId)).toBe(true);
    expect(await links.redeem(token)).toBeUndefined();
  });

  it("keeps neither the token nor the key in the ledger, and a token is no session nor a session a link", async () => {
    const { token } = await links.mint(keyId, 5 * MINUTE);
    const files = (await readdir(home)).filter((f) => f.startsWith("ledger.sqlite"));
    const bytes = Buffer.concat(await Promise.all(files.map((f) => readFile(join(home, f)))));
    expect(bytes.includes(token)).toBe(false);
    expect(bytes.includes(key)).toBe(false);
    const session = await sessions.create(keyId);
    // A link's token presented as the session cookie, and a session id presented as a link.
    expect(await sessions.check(token)).toBeUndefined();
    expect(await links.redeem(session.id)).toBeUndefined();
    // Both still work as what they are.
    expect((await sessions.check(session.id))?.principal.keyId).toBe(keyId);
    expect((await links.redeem(token))?.keyId).toBe(keyId);
    expect(await links.redeem("not a token")).toBeUndefined();
  });
});
