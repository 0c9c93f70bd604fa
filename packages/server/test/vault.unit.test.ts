import { mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { createServer, connect } from "node:tls";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { afterEach, describe, expect, it } from "vitest";
import { seal, unseal, Vault } from "../src/gateway/vault.ts";
import { EgressCa } from "../src/gateway/egress-ca.ts";
import { openStore } from "../src/ledger/store.ts";
import { insertTestSandbox } from "./helpers/ledger-rows.ts";

const dirs: string[] = [];
async function home(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "bothy-vault-"));
  dirs.push(dir);
  return dir;
}
afterEach(async () => {
  for (const d of dirs.splice(0)) await rm(d, { recursive: true, force: true });
});

describe("sealing", () => {
  const key = randomBytes(32);
  const value = Buffer.from("ghp_the-real-token");

  it("opens what it sealed, under the same tenant and name only", async () => {
    const sealed = seal(key, "acme", "github", value);
    expect(sealed.includes(value)).toBe(false);
    expect(unseal(key, "acme", "github", sealed).equals(value)).toBe(true);
    expect(() => unseal(key, "other", "github", sealed)).toThrow();
    expect(() => unseal(key, "acme", "gitlab", sealed)).toThrow();
    // The separator keeps ("ab", "c") and ("a", "bc") apart.
    expect(() => unseal(key, "acm", "egithub", sealed)).toThrow();
    expect(() => unseal(randomBytes(32), "acme", "github", sealed)).toThrow();
  });

  it("refuses a changed byte and uses a fresh nonce each time", async () => {
    const sealed = seal(key, "acme", "github", value);
    const flipped = Buffer.from(sealed);
    flipped[flipped.length - 1] = (flipped[flipped.length - 1] ?? 0) ^ 1;
    expect(() => unseal(key, "acme", "github", flipped)).toThrow();
    expect(seal(key, "acme", "github", value).equals(sealed)).toBe(false);
  });
});

describe("vault", () => {
  it("makes its key 0600 in a 0700 directory and keeps it across opens", async () => {
    const h = await home();
    const ledger = await openStore({ sqlitePath: join(h, "ledger.sqlite") });
    try {
      const vault = await Vault.open(h, ledger.secrets);
      expect((await stat(join(h, "secrets"))).mode & 0o777).toBe(0o700);
      const keyStat = await stat(join(h, "secrets", "vault.key"));
      expect(keyStat.mode & 0o777).toBe(0o600);
      expect(keyStat.size).toBe(32);
      const put = await vault.put("default", "github", { value: "ghp_secret_value", hosts: ["api.github.com"] });
      expect(put.created).toBe(true);
      expect(JSON.stringify(put.info)).not.toContain("ghp_secret_value");
      expect((await vault.put("default", "github", { value: "ghp_other", hosts: ["api.github.com"] })).created).toBe(
        false,
      );
      const again = await Vault.open(h, ledger.secrets);
      expect((await again.reveal("default", "github")).toString()).toBe("ghp_other");
      await expect(vault.requireAll("default", ["github", "nope"])).rejects.toThrow(/nope/);
    } finally {
      await ledger.close();
    }
  });

  it("binds placeholders to a sandbox, and a deleted sandbox's or secret's binding goes nowhere", async () => {
    const h = await home();
    const ledger = await openStore({ sqlitePath: join(h, "ledger.sqlite") });
    try {
      const vault = await Vault.open(h, ledger.secrets);
      await vault.put("default", "github", { value: "v1", hosts: ["api.github.com"] });
      await vault.put("default", "npm_token", {
        value: "v2",
        hosts: ["registry.npmjs.org"],
        inject: { header: "Authorization", format: "Bearer {value}" },
      });
      insertTestSandbox(ledger, { id: "sbx_a" });
      await vault.bindSandbox("default", "sbx_a", ["github", "npm_token", "github"]);
      const env = await vault.placeholderEnv("sbx_a");
      expect(Object.keys(env)).toEqual(["GITHUB", "NPM_TOKEN"]);
      for (const p of Object.values(env)) expect(p).toMatch(/^bothy_ph_[a-z2-7]{32}$/);
      expect(await vault.bindings("sbx_a")).toEqual([
        { name: "github", env: "GITHUB", placeholder: env["GITHUB"], hosts: ["api.github.com"], inject: null },
        {
          name: "npm_token",
          env: "NPM_TOKEN",
          placeholder: env["NPM_TOKEN"],
          hosts: ["registry.npmjs.org"],
          inject: { header: "Authorization", format: "Bearer {value}" },
        },
      ]);
      // A secret deleted from the vault: its placeholder stays, bound to no host.
      await vault.delete("default", "npm_token");
      expect((await vault.bindings("sbx_a")).find((b) => b.name === "npm_token")?.hosts).toEqual([]);
      // A deleted sandbox: its rows stay for the record, but bind nothing.
      await ledger.transition("sbx_a", "running", "deleting");
      await ledger.transition("sbx_a", "deleting", "deleted");
      expect(await vault.bindings("sbx_a")).toEqual([]);
    } finally {
      await ledger.close();
    }
  });

  it("refuses to make a new key while sealed values exist", async () => {
    const h = await home();
    const ledger = await openStore({ sqlitePath: join(h, "ledger.sqlite") });
    try {
      const vault = await Vault.open(h, ledger.secrets);
      await vault.put("default", "github", { value: "v", hosts: ["api.github.com"] });
      await rm(join(h, "secrets", "vault.key"));
      await expect(Vault.open(h, ledger.secrets)).rejects.toThrow(/missing/);
    } finally {
      await ledger.close();
    }
  });

  it("reads BOTHY_VAULT_KEY_FILE's key and never makes it; a start with another key than the ledger's is refused", async () => {
    const h = await home();
    const other = await home();
    const keyFile = join(other, "vault.key");
    const ledger = await openStore({ sqlitePath: join(h, "ledger.sqlite") });
    try {
      await expect(Vault.open(h, ledger.secrets, keyFile)).rejects.toThrow(
        /BOTHY_VAULT_KEY_FILE names .* which does not exist/,
      );
      await writeFile(keyFile, randomBytes(32), { mode: 0o600 });
      const vault = await Vault.open(h, ledger.secrets, keyFile);
      await vault.put("default", "github", { value: "ghp_given_key", hosts: ["api.github.com"] });
      // Nothing was made in the home: the key is the file's.
      await expect(stat(join(h, "secrets", "vault.key"))).rejects.toMatchObject({ code: "ENOENT" });
      expect((await Vault.open(h, ledger.secrets, keyFile)).derive("link key")).toEqual(vault.derive("link key"));
      expect((await vault.reveal("default", "github")).toString()).toBe("ghp_given_key");

      // Another key (a node given the wrong file, or one that made its own) is refused at start,
      // with no word of either key in the message.
      const wrong = randomBytes(32);
      await writeFile(keyFile, wrong);
      const refused = await Vault.open(h, ledger.secrets, keyFile).then(
        () => undefined,
        (err: unknown) => err as Error,
      );
      expect(refused?.message).toMatch(/is not the one this ledger's secrets are sealed with/);
      expect(refused?.message).not.toContain(wrong.toString("hex"));
      // The ledger keeps a fingerprint, never the key.
      const dump = (await readFile(join(h, "ledger.sqlite"))).toString("hex");
      expect(dump).not.toContain(wrong.toString("hex"));
    } finally {
      await ledger.close();
    }
  });

  it("derives a different key per purpose, none of them the vault's", async () => {
    const h = await home();
    const ledger = await openStore({ sqlitePath: join(h, "ledger.sqlite") });
    try {
      const vault = await Vault.open(h, ledger.secrets);
      const key = await readFile(join(h, "secrets", "vault.key"));
      const derived = ["api key pepper", "link key", "envd token key"].map((p) => vault.derive(p).toString("hex"));
      expect(new Set(derived).size).toBe(3);
      expect(derived).not.toContain(key.toString("hex"));
    } finally {
      await ledger.close();
    }
  });
});

describe("egress CA", () => {
  it("signs leaves a TLS client that trusts the CA accepts for that host only", async () => {
    const h = await home();
    const ca = await EgressCa.open(h);
    expect((await stat(join(h, "secrets", "egress-ca.key"))).mode & 0o777).toBe(0o600);
    expect(ca.caPem).toContain("BEGIN CERTIFICATE");
    expect(ca.caPem).not.toContain("PRIVATE");
    // The same CA after a restart.
    expect((await EgressCa.open(h)).caPem).toBe(ca.caPem);
    expect(await readFile(join(h, "secrets", "egress-ca.crt"), "utf8")).toBe(ca.caPem);

    const leaf = await ca.leafFor("api.example.com");
    expect(await ca.leafFor("API.example.com")).toEqual(leaf);
    const server = createServer({ key: leaf.key, cert: leaf.cert }, (s) => s.end("hi"));
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const port = (server.address() as AddressInfo).port;
    const attempt = (servername: string): Promise<string> =>
      new Promise((resolve, reject) => {
        const s = connect({ host: "127.0.0.1", port, servername, ca: ca.caPem }, () => {
          s.once("data", (d: Buffer) => resolve(d.toString()));
        });
        s.once("error", reject);
      });
    try {
      expect(await attempt("api.example.com")).toBe("hi");
      await expect(attempt("other.example.com")).rejects.toThrow(/altnames|does not match/i);
    } finally {
      server.close();
    }
  });
});
