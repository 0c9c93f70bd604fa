/**
 * The egress gateway's name resolution and address checks: a host is resolved with the server's
 * resolvers (BOTHY_DNS), answers cached by their TTL, and every address is checked as the nft rules
 * would judge it, on each use. The proxy dials exactly an address that passed here, so a name that
 * resolves to a private, pool or blocked address never reaches one (DNS rebinding included).
 */
import { Resolver } from "node:dns/promises";
import { cidrContains, parseCidr, parseIpv4 } from "../network/ipv4.ts";
import type { GatewaySandbox } from "./contracts.ts";
import type { SandboxLookup } from "./gateway-lookup.ts";

const RESOLVE_TIMEOUT_MS = 5_000;
const DNS_CACHE_MAX_S = 60;
const DNS_CACHE_ENTRIES = 4096;

export class EgressResolver {
  private readonly resolver: Resolver;
  /** Answers by name until their TTL (at most DNS_CACHE_MAX_S): every address is still checked on each use. */
  private readonly answers = new Map<string, { addresses: string[]; until: number }>();

  constructor(dns: string[]) {
    this.resolver = new Resolver({ timeout: RESOLVE_TIMEOUT_MS, tries: 2 });
    this.resolver.setServers(dns);
  }

  async resolve(host: string): Promise<string[]> {
    const cached = this.answers.get(host);
    if (cached && cached.until > Date.now()) return cached.addresses;
    const records = await this.resolver.resolve4(host, { ttl: true });
    const ttl = Math.min(DNS_CACHE_MAX_S, ...records.map((r) => r.ttl));
    const addresses = records.map((r) => r.address);
    if (this.answers.size >= DNS_CACHE_ENTRIES) this.answers.clear();
    if (ttl > 0) this.answers.set(host, { addresses, until: Date.now() + ttl * 1000 });
    return addresses;
  }

  /** Ends the lookups under way: they fail, and so do the requests that wait on them. */
  cancel(): void {
    this.resolver.cancel();
  }
}

/** Why the sandbox may not reach this address, as the nft rules judge it; undefined: it may. */
export function addressRefusal(
  lookup: SandboxLookup | undefined,
  sb: GatewaySandbox,
  address: string,
  explicit: boolean,
): string | undefined {
  const a = parseIpv4(address);
  const inside = (list: readonly string[]): string | undefined => list.find((c) => cidrContains(parseCidr(c), a));
  const never = inside(lookup?.unreachable?.() ?? []);
  if (never) return `in ${never}, the host or other sandboxes, which no sandbox reaches`;
  if (inside(sb.allowOut)) return undefined;
  const denied = inside(sb.denyOut);
  if (denied) return `in deny_out ${denied}`;
  const blocked = inside(lookup?.blocked() ?? []);
  if (blocked) return `in ${blocked}, which no sandbox reaches unless allow_out names it`;
  if (sb.internet === false && !explicit) return "internet is off and no allow rule names this host";
  return undefined;
}
