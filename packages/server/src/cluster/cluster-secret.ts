import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { readFile } from "node:fs/promises";

/** The header a node adds to a request it forwards to another: `v1;<from node>;<ms>;<nonce>;<hmac>`. */
export const FORWARDED_HEADER = "bothy-forwarded";

/** How far a forwarded request's time may be from the receiver's clock (hosts' clocks, kept by NTP). */
const WINDOW_MS = 30_000;
/** Nonces remembered at most: past this, forwarded requests are refused until old ones age out. */
const MAX_NONCES = 200_000;

export type ForwardCheck = { ok: true; from: string } | { ok: false; why: string };

/**
 * The cluster's shared secret (BOTHY_CLUSTER_SECRET_FILE, the same on every node), and what it
 * proves: that a request was forwarded by a node of this cluster, for this method and URL, within
 * the last half minute, and never before. A forwarded request carries the caller's own credentials,
 * which the receiving node checks as if it were called directly: the signature grants no access, it
 * only tells the receiver to answer the request itself rather than send it on (or place a create
 * elsewhere). The network a request came from proves nothing.
 */
export class ClusterSecret {
  /** Nonces seen, with when they may be forgotten (their time is out of the window by then). */
  private readonly seen = new Map<string, number>();

  private constructor(private readonly key: Buffer) {}

  static async load(file: string): Promise<ClusterSecret> {
    const text = (
      await readFile(file, "utf8").catch((err: unknown) => {
        throw new Error(
          `BOTHY_CLUSTER_SECRET_FILE names ${file}, which cannot be read (${(err as Error).message}); copy the cluster's secret file there (the same on every node).`,
        );
      })
    ).trim();
    if (text.length < 32)
      throw new Error(
        `The cluster secret in ${file} is ${text.length} characters; use 32 or more random ones (e.g. \`openssl rand -hex 32\`), the same file on every node.`,
      );
    return new ClusterSecret(Buffer.from(text, "utf8"));
  }

  static fromString(text: string): ClusterSecret {
    return new ClusterSecret(Buffer.from(text, "utf8"));
  }

  /** The header value for a request `from` forwards as `method url` (the URL's path and query). */
  sign(from: string, method: string, url: string, now = Date.now()): string {
    const nonce = randomBytes(16).toString("hex");
    return [`v1`, from, String(now), nonce, this.mac(from, now, nonce, method, url)].join(";");
  }

  /** Whether `header` was made by a node of this cluster for `method url`, recently, and not seen before. */
  verify(header: string, method: string, url: string, now = Date.now()): ForwardCheck {
    const parts = header.split(";");
    if (parts.length !== 5 || parts[0] !== "v1") return { ok: false, why: "it is not of the form bothy sends" };
    const [, from = "", ts = "", nonce = "", mac = ""] = parts;
    const at = Number(ts);
    if (!/^[0-9]{1,15}$/.test(ts) || !/^[0-9a-f]{32}$/.test(nonce) || !/^[0-9a-f]{64}$/.test(mac))
      return { ok: false, why: "it is not of the form bothy sends" };
    const want = Buffer.from(this.mac(from, at, nonce, method, url), "hex");
    if (!timingSafeEqual(want, Buffer.from(mac, "hex"))) return { ok: false, why: "its signature does not verify" };
    if (Math.abs(now - at) > WINDOW_MS) return { ok: false, why: "it is too old (or the nodes' clocks differ)" };
    this.forget(now);
    if (this.seen.has(nonce)) return { ok: false, why: "it was seen before (a replay)" };
    if (this.seen.size >= MAX_NONCES) return { ok: false, why: "this node is taking too many forwarded requests" };
    this.seen.set(nonce, at + WINDOW_MS);
    return { ok: true, from };
  }

  private mac(from: string, at: number, nonce: string, method: string, url: string): string {
    return createHmac("sha256", this.key)
      .update(["bothy-forwarded-v1", from, String(at), nonce, method.toUpperCase(), url].join("\n"))
      .digest("hex");
  }

  /** Drops nonces whose time has left the window (Map keeps insertion order, nearly time order). */
  private forget(now: number): void {
    for (const [nonce, until] of this.seen) {
      if (until > now) break;
      this.seen.delete(nonce);
    }
  }
}
