/**
 * What a create's `allow_out` may open. A key with `sandboxes:write` may name public addresses;
 * a private, metadata or BOTHY_NET_BLOCK address needs the `network:private` scope (which an
 * admin grants) and must lie inside a block the operator listed in BOTHY_ALLOW_OUT_PERMIT (empty
 * by default: nothing private opens). Loopback, `0/8` and the pool (every other sandbox and the
 * host's end of every link) never open, whatever either says; the nft rules refuse them before
 * any `allow_out` accept too (nft-ruleset.ts), so a policy stored before this check still cannot.
 */
import { BothyError } from "@bothy/protocol";
import type { Scope } from "../auth/scopes.ts";
import { cidrContains, cidrsOverlap, formatCidr, parseCidr, type Cidr } from "./ipv4.ts";
import { NEVER_OPEN, PRIVATE_RANGES } from "./nft-ruleset.ts";

/** The scope a key needs for an `allow_out` entry in a private or blocked range. */
export const PRIVATE_SCOPE = "network:private" satisfies Scope;

export interface AllowOutCeiling {
  /** BOTHY_NET_POOL. */
  pool: string;
  /** BOTHY_NET_BLOCK: closed like the private ranges, and opened the same way. */
  extraBlocked: readonly string[];
  /** BOTHY_ALLOW_OUT_PERMIT: the blocks a private `allow_out` entry must lie inside. */
  permit: readonly string[];
}

const inside = (outer: Cidr, inner: Cidr): boolean => outer.prefix <= inner.prefix && cidrContains(outer, inner.base);

/** Every block no `allow_out` opens: loopback, `0/8` and the pool. */
export const neverOpen = (pool: string): string[] => [...NEVER_OPEN, formatCidr(parseCidr(pool))];

/**
 * Refuses, at start-up, a permit that names what never opens; undefined when the permit is sound,
 * else what is wrong with it (the caller says how to fix the setting).
 */
export function permitProblem(permit: readonly string[], pool: string): string | undefined {
  for (const text of permit) {
    let p: Cidr;
    try {
      p = parseCidr(text);
    } catch {
      return `"${text}" is not an IPv4 address or CIDR block`;
    }
    const never = neverOpen(pool).find((n) => cidrsOverlap(parseCidr(n), p));
    if (never)
      return `${formatCidr(p)} overlaps ${never}, which no sandbox may reach (loopback, 0/8, the sandbox pool)`;
  }
  return undefined;
}

/**
 * Throws a 403 for the first `allow_out` entry (normalized CIDRs) the caller may not open:
 * `allow_out_not_permitted` for the pool, loopback and anything outside the permit,
 * `scope_missing` for a private entry from a key without `network:private`.
 */
export function checkAllowOut(allowOut: readonly string[], ceiling: AllowOutCeiling, mayOpenPrivate: boolean): void {
  const never = neverOpen(ceiling.pool);
  const closed = [...PRIVATE_RANGES, ...ceiling.extraBlocked];
  for (const entry of allowOut) {
    const c = parseCidr(entry);
    const shown = formatCidr(c);
    const hit = never.find((n) => cidrsOverlap(parseCidr(n), c));
    if (hit)
      throw new BothyError(
        "allow_out_not_permitted",
        `allow_out ${shown} overlaps ${hit}, where the host and other sandboxes are: no sandbox reaches them, whatever allow_out says. Remove the entry.`,
        { details: { allow_out: shown, range: hit } },
      );
    const range = closed.find((r) => cidrsOverlap(parseCidr(r), c));
    if (range === undefined) continue;
    if (!mayOpenPrivate)
      throw new BothyError(
        "scope_missing",
        `allow_out ${shown} overlaps ${range}, a private, metadata or blocked range: opening it needs a key with the ${PRIVATE_SCOPE} scope, which an admin grants. Name only public addresses, or use such a key.`,
        { details: { scope: PRIVATE_SCOPE, allow_out: shown, range } },
      );
    if (!ceiling.permit.some((p) => inside(parseCidr(p), c)))
      throw new BothyError(
        "allow_out_not_permitted",
        `allow_out ${shown} overlaps ${range}, and this server opens no such address outside BOTHY_ALLOW_OUT_PERMIT${ceiling.permit.length === 0 ? " (empty: none at all)" : ""}. Ask the operator to permit the block, or name only public addresses.`,
        { details: { allow_out: shown, range } },
      );
  }
}
