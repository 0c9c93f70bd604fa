/**
 * The certificate authority the egress gateway signs its leaf certificates with, so a sandbox's
 * TLS to a host a secret is bound to can be terminated on the host. Made on first start (ECDSA
 * P-256, ten years): key in `$BOTHY_HOME/secrets/egress-ca.key` (0600), certificate beside it in
 * `egress-ca.crt`. Guests get only the certificate (guest-trust.ts); the key never leaves the host.
 */
import "reflect-metadata"; // @peculiar/x509's dependency injection needs it loaded first
import * as x509 from "@peculiar/x509";
import { randomBytes, webcrypto } from "node:crypto";
import { chmod, mkdir, readFile, rename, writeFile } from "node:fs/promises";
import { isIP } from "node:net";
import { join } from "node:path";
import type { LeafIssuer } from "./contracts.ts";

x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);

type CryptoKey = webcrypto.CryptoKey;

const ALG = { name: "ECDSA", namedCurve: "P-256", hash: "SHA-256" } as const;
const DAY_MS = 24 * 3600 * 1000;
const CA_DAYS = 3650;
/** Leaves are short-lived and made again a day before they end. */
const LEAF_DAYS = 30;
const LEAF_RENEW_MS = DAY_MS;
/** Cached leaves at most; the oldest go first. */
const LEAF_CACHE = 1024;

const subtle = webcrypto.subtle;

function serial(): string {
  const bytes = randomBytes(16);
  bytes[0] = (bytes[0] ?? 0) & 0x7f; // a positive integer
  return bytes.toString("hex");
}

async function keyPem(key: CryptoKey): Promise<string> {
  return x509.PemConverter.encode(await subtle.exportKey("pkcs8", key), "PRIVATE KEY");
}

interface Leaf {
  key: string;
  cert: string;
  notAfter: number;
}

export class EgressCa implements LeafIssuer {
  private readonly leaves = new Map<string, Promise<Leaf>>();

  private constructor(
    private readonly cert: x509.X509Certificate,
    private readonly key: CryptoKey,
    readonly caPem: string,
  ) {}

  /** Loads the CA from `$BOTHY_HOME/secrets`, making it first when either file is missing. */
  static async open(home: string): Promise<EgressCa> {
    const dir = join(home, "secrets");
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await chmod(dir, 0o700);
    const keyFile = join(dir, "egress-ca.key");
    const certFile = join(dir, "egress-ca.crt");
    const [keyText, certText] = await Promise.all([
      readFile(keyFile, "utf8").catch(absent),
      readFile(certFile, "utf8").catch(absent),
    ]);
    if (keyText !== undefined && certText !== undefined) {
      const key = await subtle.importKey("pkcs8", x509.PemConverter.decodeFirst(keyText), ALG, false, ["sign"]);
      const cert = new x509.X509Certificate(certText);
      return new EgressCa(cert, key, cert.toString("pem") + "\n");
    }
    const keys = await subtle.generateKey(ALG, true, ["sign", "verify"]);
    const now = Date.now();
    const cert = await x509.X509CertificateGenerator.createSelfSigned({
      serialNumber: serial(),
      name: "CN=bothy egress gateway CA, O=bothy",
      notBefore: new Date(now - DAY_MS),
      notAfter: new Date(now + CA_DAYS * DAY_MS),
      signingAlgorithm: ALG,
      keys,
      extensions: [
        new x509.BasicConstraintsExtension(true, 0, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
        await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
      ],
    });
    // The key first, each through a temporary name: a crash leaves either the old state or both files.
    await writeFile(`${keyFile}.tmp`, await keyPem(keys.privateKey), { mode: 0o600 });
    await rename(`${keyFile}.tmp`, keyFile);
    await writeFile(`${certFile}.tmp`, cert.toString("pem") + "\n", { mode: 0o644 });
    await rename(`${certFile}.tmp`, certFile);
    const key = await subtle.importKey("pkcs8", await subtle.exportKey("pkcs8", keys.privateKey), ALG, false, ["sign"]);
    return new EgressCa(cert, key, cert.toString("pem") + "\n");
  }

  async leafFor(host: string): Promise<{ key: string; cert: string }> {
    const name = host.toLowerCase();
    const cached = this.leaves.get(name);
    if (cached) {
      const leaf = await cached;
      if (leaf.notAfter - Date.now() > LEAF_RENEW_MS) return { key: leaf.key, cert: leaf.cert };
    }
    const made = this.sign(name);
    this.leaves.delete(name);
    this.leaves.set(name, made);
    made.catch(() => this.leaves.delete(name));
    while (this.leaves.size > LEAF_CACHE) this.leaves.delete(this.leaves.keys().next().value as string);
    const leaf = await made;
    return { key: leaf.key, cert: leaf.cert };
  }

  private async sign(host: string): Promise<Leaf> {
    const keys = await subtle.generateKey(ALG, true, ["sign", "verify"]);
    const now = Date.now();
    const notAfter = now + LEAF_DAYS * DAY_MS;
    const cert = await x509.X509CertificateGenerator.create({
      serialNumber: serial(),
      subject: `CN=${host.replace(/[,+"\\<>;=]/g, "")}`,
      issuer: this.cert.subject,
      notBefore: new Date(now - 3600_000),
      notAfter: new Date(notAfter),
      signingAlgorithm: ALG,
      publicKey: keys.publicKey,
      signingKey: this.key,
      extensions: [
        new x509.BasicConstraintsExtension(false, undefined, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
        new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
        new x509.SubjectAlternativeNameExtension([{ type: isIP(host) ? "ip" : "dns", value: host }]),
        await x509.AuthorityKeyIdentifierExtension.create(this.cert),
      ],
    });
    return { key: await keyPem(keys.privateKey), cert: cert.toString("pem"), notAfter };
  }
}

function absent(err: NodeJS.ErrnoException): undefined {
  if (err.code === "ENOENT") return undefined;
  throw err;
}
