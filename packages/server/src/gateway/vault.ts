/**
 * The secrets vault: values sealed with AES-256-GCM under a key in `$BOTHY_HOME/secrets/vault.key`
 * (32 random bytes, 0600, made on first start) or the file BOTHY_VAULT_KEY_FILE names (never made:
 * several nodes share one key, from a mounted secret), with `tenant \0 name` as associated data so
 * a sealed value moved to another tenant or name does not open. The ledger holds only
 * `nonce | tag | ciphertext`, and the key's fingerprint (a key derived from it, which tells nothing
 * of it), so a node started with another key refuses to start; a value is opened on each use by the
 * gateway and never kept, shown, logged or sent to a guest.
 */
import { createCipheriv, createDecipheriv, hkdfSync, randomBytes, timingSafeEqual } from "node:crypto";
import { chmod, mkdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { z } from "zod";
import { BothyError, type SecretInfo, type putSecretRequest } from "@bothy/protocol";
import type { SecretRows, SecretRow } from "../ledger/secret-rows.ts";
import { newPlaceholder } from "../util/ids.ts";
import type { SecretBinding, SecretSource } from "./contracts.ts";

const KEY_BYTES = 32;
const NONCE_BYTES = 12;
const TAG_BYTES = 16;

function aad(tenant: string, name: string): Buffer {
  return Buffer.from(`${tenant}\0${name}`, "utf8");
}

/** `nonce | tag | ciphertext` of `value` under `key`, bound to the tenant and name. */
export function seal(key: Buffer, tenant: string, name: string, value: Buffer): Buffer {
  const nonce = randomBytes(NONCE_BYTES);
  const cipher = createCipheriv("aes-256-gcm", key, nonce);
  cipher.setAAD(aad(tenant, name));
  const ciphertext = Buffer.concat([cipher.update(value), cipher.final()]);
  return Buffer.concat([nonce, cipher.getAuthTag(), ciphertext]);
}

/** The value `seal` sealed; throws when the key, tenant or name differ or a byte was changed. */
export function unseal(key: Buffer, tenant: string, name: string, sealed: Buffer): Buffer {
  if (sealed.length < NONCE_BYTES + TAG_BYTES) throw new Error("sealed value too short");
  const decipher = createDecipheriv("aes-256-gcm", key, sealed.subarray(0, NONCE_BYTES));
  decipher.setAAD(aad(tenant, name));
  decipher.setAuthTag(sealed.subarray(NONCE_BYTES, NONCE_BYTES + TAG_BYTES));
  return Buffer.concat([decipher.update(sealed.subarray(NONCE_BYTES + TAG_BYTES)), decipher.final()]);
}

/**
 * A key for `purpose` derived from the vault's (HKDF-SHA256): what else every node of a cluster must
 * hold alike (the API keys' pepper, the link and envd token keys) comes from the one key the
 * operator supplies, and telling one of them tells nothing of the vault's key or the others.
 */
export function deriveKey(vaultKey: Buffer, purpose: string): Buffer {
  return Buffer.from(hkdfSync("sha256", vaultKey, Buffer.alloc(0), `bothy ${purpose}`, KEY_BYTES));
}

/** The key in BOTHY_VAULT_KEY_FILE, which bothy never makes: a node that made its own would seal with a key no other holds. */
async function readGivenKey(file: string): Promise<Buffer> {
  let key: Buffer;
  try {
    key = await readFile(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT")
      throw new Error(
        `BOTHY_VAULT_KEY_FILE names ${file}, which does not exist: put the vault's key there (32 random bytes, the same file on every node; \`head -c 32 /dev/urandom > vault.key\` makes one for a new cluster), or unset it to keep the key in $BOTHY_HOME/secrets/vault.key.`,
      );
    throw err;
  }
  if (key.length !== KEY_BYTES) throw new Error(`${file} holds ${key.length} bytes; the vault key is 32 random bytes.`);
  return key;
}

/**
 * The vault's key: BOTHY_VAULT_KEY_FILE's, else the home's, made on first start. Refuses to make a
 * new one while sealed values exist: none would open.
 */
export async function loadVaultKey(home: string, rows: SecretRows, keyFile?: string): Promise<Buffer> {
  if (keyFile !== undefined) return readGivenKey(keyFile);
  const dir = join(home, "secrets");
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await chmod(dir, 0o700);
  const file = join(dir, "vault.key");
  try {
    if ((await rows.list()).length > 0) await readFile(file);
    else await writeFile(file, randomBytes(KEY_BYTES), { mode: 0o600, flag: "wx" });
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT")
      throw new Error(
        `${file} is missing but the ledger holds secrets sealed with it: restore it from a backup, or delete the secrets (none opens without it).`,
      );
    if (code !== "EEXIST") throw err;
  }
  const key = await readFile(file);
  if (key.length !== KEY_BYTES) throw new Error(`${file} holds ${key.length} bytes; the vault key is 32 random bytes.`);
  return key;
}

/** The sandbox's variable of a secret: its name upper-cased (`github` → `GITHUB`). */
export const envNameOf = (name: string): string => name.toUpperCase();

function infoOf(row: SecretRow): SecretInfo {
  return {
    name: row.name,
    tenant: row.tenant,
    hosts: JSON.parse(row.hosts) as string[],
    inject: row.inject === null ? null : (JSON.parse(row.inject) as { header: string; format: string }),
    created_at: row.created_at,
    updated_at: row.updated_at,
  };
}

export class Vault implements SecretSource {
  private constructor(
    private readonly key: Buffer,
    private readonly rows: SecretRows,
  ) {}

  /**
   * Loads the key (`keyFile`: BOTHY_VAULT_KEY_FILE) and checks it is the ledger's: the first start
   * records its fingerprint, and a start with another key is refused before anything is sealed or
   * opened with it.
   */
  static async open(home: string, rows: SecretRows, keyFile?: string): Promise<Vault> {
    const key = await loadVaultKey(home, rows, keyFile);
    const fingerprint = deriveKey(key, "vault key fingerprint");
    const recorded = Buffer.from(
      await rows.vaultFingerprint(fingerprint.toString("hex"), new Date().toISOString()),
      "hex",
    );
    if (recorded.length !== fingerprint.length || !timingSafeEqual(recorded, fingerprint))
      throw new Error(
        `The vault key in ${keyFile ?? join(home, "secrets", "vault.key")} is not the one this ledger's secrets are sealed with (its fingerprint differs from the one the ledger recorded at its first start): start this node with the cluster's vault key, the same file on every node (BOTHY_VAULT_KEY_FILE, or $BOTHY_HOME/secrets/vault.key). Nothing was sealed or opened with this one.`,
      );
    return new Vault(key, rows);
  }

  /** A key every node holding this vault's key derives alike (`deriveKey`). */
  derive(purpose: string): Buffer {
    return deriveKey(this.key, purpose);
  }

  /**
   * Seals a value the server keeps for a sandbox beyond the vault (the E2B create's envVars) under
   * the vault's key, bound to `purpose` and the sandbox, so the ledger never holds it in clear.
   */
  sealFor(purpose: string, sandboxId: string, value: Buffer): Buffer {
    return seal(this.key, `@${purpose}`, sandboxId, value);
  }

  /** The value `sealFor` sealed; throws when it was altered or sealed for another purpose or sandbox. */
  unsealFor(purpose: string, sandboxId: string, sealed: Buffer): Buffer {
    return unseal(this.key, `@${purpose}`, sandboxId, sealed);
  }

  /** Seals and stores the value; true when the secret is new, false when it replaced one. */
  async put(
    tenant: string,
    name: string,
    body: z.output<typeof putSecretRequest>,
  ): Promise<{ created: boolean; info: SecretInfo }> {
    const created = await this.rows.put({
      tenant,
      name,
      sealed: seal(this.key, tenant, name, Buffer.from(body.value, "utf8")),
      hosts: JSON.stringify(body.hosts),
      inject: body.inject === undefined ? null : JSON.stringify(body.inject),
    });
    return { created, info: await this.info(tenant, name) };
  }

  async info(tenant: string, name: string): Promise<SecretInfo> {
    const row = await this.rows.get(tenant, name);
    if (!row) throw secretNotFound(name);
    return infoOf(row);
  }

  /** The tenant's secrets; every tenant's when `tenant` is undefined. */
  async list(tenant?: string): Promise<SecretInfo[]> {
    return (await this.rows.list(tenant)).map(infoOf);
  }

  /** Removes it; sandboxes bound to it keep their placeholder, which no host then accepts. */
  async delete(tenant: string, name: string): Promise<SecretInfo> {
    const info = await this.info(tenant, name);
    await this.rows.delete(tenant, name);
    return info;
  }

  /** Refuses, naming them, when the tenant's vault lacks any of `names` (before a create makes anything). */
  async requireAll(tenant: string, names: string[]): Promise<void> {
    const missing = await this.rows.missing(tenant, [...new Set(names)]);
    if (missing.length > 0)
      throw new BothyError(
        "secret_unknown",
        `The vault of tenant ${tenant} has no secret ${missing.join(", ")}; PUT /secrets/{name} first, or leave it out of \`secrets\`.`,
        { details: { secrets: missing } },
      );
  }

  /** Gives a sandbox made now (its ledger row exists) a new placeholder for each named secret. */
  async bindSandbox(tenant: string, sandboxId: string, names: string[]): Promise<void> {
    await this.requireAll(tenant, names);
    const unique = [...new Set(names)];
    await this.rows.bind(
      unique.map((name) => ({ sandbox_id: sandboxId, name, env: envNameOf(name), placeholder: newPlaceholder() })),
    );
  }

  /** `ENV=placeholder` of each secret bound to the sandbox: what its commands see. */
  async placeholderEnv(sandboxId: string): Promise<Record<string, string>> {
    return Object.fromEntries((await this.rows.bindings(sandboxId)).map((b) => [b.env, b.placeholder]));
  }

  /** A deleted secret's binding has no hosts: its placeholder is refused everywhere. */
  async bindings(sandboxId: string): Promise<SecretBinding[]> {
    return (await this.rows.bindings(sandboxId)).map((b) => ({
      name: b.name,
      env: b.env,
      placeholder: b.placeholder,
      hosts: b.hosts === null ? [] : (JSON.parse(b.hosts) as string[]),
      inject: b.inject === null ? null : (JSON.parse(b.inject) as { header: string; format: string }),
    }));
  }

  async reveal(tenant: string, name: string): Promise<Buffer> {
    const row = await this.rows.get(tenant, name);
    if (!row) throw secretNotFound(name);
    try {
      return unseal(this.key, tenant, name, row.sealed);
    } catch (err) {
      throw new Error(
        `Secret ${name.slice(0, 64)} of tenant ${tenant.slice(0, 64)} does not open with this node's vault key (altered in the ledger, or sealed under another key): put it again with PUT /secrets/{name}.`,
        { cause: err },
      );
    }
  }
}

function secretNotFound(name: string): BothyError {
  return new BothyError("secret_not_found", `No secret ${name.slice(0, 64)}; GET /secrets lists them.`);
}
