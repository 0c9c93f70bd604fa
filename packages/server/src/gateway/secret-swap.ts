/**
 * What the gateway does to one request of a sandbox with secrets, on a host it terminates: a
 * placeholder of a secret not bound to that host anywhere in the request refuses it; for the
 * secrets bound to it, placeholders in headers become the values, and an `inject` header is set.
 */
import type { SecretBinding } from "./contracts.ts";
import { hostMatches } from "./host-policy.ts";

export type HeaderValue = string | string[] | undefined;
export type Headers = Record<string, HeaderValue>;

/** The sandbox's secrets split by whether `host` is one they may be sent to. */
export function splitByHost(
  host: string,
  bindings: SecretBinding[],
): { bound: SecretBinding[]; unbound: SecretBinding[] } {
  const bound: SecretBinding[] = [];
  const unbound: SecretBinding[] = [];
  for (const b of bindings) (b.hosts.some((p) => hostMatches(p, host)) ? bound : unbound).push(b);
  return { bound, unbound };
}

const BASIC_RE = /^(\s*basic\s+)([A-Za-z0-9+/=]+)\s*$/i;

/** A header value and, for `Basic` credentials, the decoded `user:password` a placeholder may hide in. */
function readable(value: string): string[] {
  const basic = BASIC_RE.exec(value);
  return basic?.[2] ? [value, Buffer.from(basic[2], "base64").toString("utf8")] : [value];
}

/** The secrets whose placeholder appears in the request line or a header (names included). */
export function placeholdersIn(unbound: SecretBinding[], url: string, headers: Headers): SecretBinding[] {
  const texts = [url];
  for (const [name, value] of Object.entries(headers)) {
    texts.push(name);
    for (const v of value === undefined ? [] : Array.isArray(value) ? value : [value]) texts.push(...readable(v));
  }
  return unbound.filter((b) => texts.some((t) => t.includes(b.placeholder)));
}

function swapOne(
  value: string,
  bound: SecretBinding[],
  valueOf: (b: SecretBinding) => string,
  used: Set<string>,
): string {
  let out = value;
  for (const b of bound)
    if (out.includes(b.placeholder)) {
      out = out.split(b.placeholder).join(valueOf(b));
      used.add(b.name);
    }
  const basic = BASIC_RE.exec(out);
  if (basic?.[1] && basic[2]) {
    const decoded = Buffer.from(basic[2], "base64").toString("utf8");
    if (bound.some((b) => decoded.includes(b.placeholder)))
      return `${basic[1]}${Buffer.from(swapOne(decoded, bound, valueOf, used), "utf8").toString("base64")}`;
  }
  return out;
}

/**
 * The headers to send upstream: placeholders of bound secrets replaced by their values (also
 * inside `Basic` credentials), then each bound secret's `inject` header set. Returns the names
 * of the secrets it put in.
 */
export function swapHeaders(
  headers: Headers,
  bound: SecretBinding[],
  valueOf: (b: SecretBinding) => string,
): { headers: Headers; used: string[] } {
  const used = new Set<string>();
  const out: Headers = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    out[name] = Array.isArray(value)
      ? value.map((v) => swapOne(v, bound, valueOf, used))
      : swapOne(value, bound, valueOf, used);
  }
  for (const b of bound) {
    if (!b.inject) continue;
    out[b.inject.header.toLowerCase()] = b.inject.format.split("{value}").join(valueOf(b));
    used.add(b.name);
  }
  return { headers: out, used: [...used] };
}
