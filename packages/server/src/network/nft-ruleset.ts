/**
 * The nftables text bothy feeds to `nft -f -`. Everything lives in one table per home,
 * `inet bothy-<tag>` (util/host-names.ts), that only that home's server touches: base chains hooked into forward, input and NAT postrouting, a verdict map from a
 * sandbox's host-side interface to that sandbox's own chain, and one chain per sandbox
 * (`sbx_<id>`). Adding or removing a sandbox is one nft transaction, atomic in the kernel.
 *
 * gVisor ignores ICMP "administratively prohibited" (shared/traps.md), so TCP is refused with a
 * reset: a blocked connect fails at once instead of timing out. The rest gets the ICMP reject.
 */
import type { EgressPolicy } from "../drivers/driver.ts";
import { nftTable } from "../util/host-names.ts";
import { cidrContains, formatCidr, parseCidr, type Cidr } from "./ipv4.ts";

/**
 * This home's host-side interfaces, as nft wildcards: `bv<tag>*` veths (gVisor), `bt<tag>*` taps
 * (VMs). Another home's interfaces never match, so its packets are that server's to judge.
 */
const ifaceWildcards = (tag: string): string[] => [`"bv${tag}*"`, `"bt${tag}*"`];

/** Ranges no sandbox reaches unless an `allow_out` entry names them. */
export const PRIVATE_RANGES = [
  "0.0.0.0/8",
  "10.0.0.0/8",
  "100.64.0.0/10",
  "127.0.0.0/8",
  "169.254.0.0/16",
  "172.16.0.0/12",
  "192.168.0.0/16",
  "224.0.0.0/3",
] as const;

/**
 * Ranges no sandbox reaches whatever its `allow_out` says, beside the pool (every other sandbox):
 * "this network" and loopback.
 */
export const NEVER_OPEN = ["0.0.0.0/8", "127.0.0.0/8"] as const;

export interface SandboxRules {
  table: string;
  sandboxId: string;
  iface: string;
  guest: string;
  policy: EgressPolicy;
}

/** The egress gateway's listening ports (gateway/egress-proxy.ts) that sandboxes' TCP 80 and 443 are redirected to. */
export interface GatewayPorts {
  http: number;
  https: number;
  /** The policy resolver's UDP port (policy-resolver.ts) their UDP 53 goes to; absent: their DNS goes out as any sandbox's. */
  dns?: number;
}

/** The set of `interface . guest address` pairs whose TCP 80/443 pass the gateway (EgressPolicy.gateway). */
export const GATEWAY_SET = "gateway";

export interface BaseRules {
  /** The home's tag: names the table and this home's interfaces. */
  tag: string;
  /** Every sandbox subnet: refused as a destination before any `allow_out` (no sandbox reaches another), masqueraded as a source. */
  pool: string;
  uplink: string;
  /** Blocked on top of PRIVATE_RANGES (BOTHY_NET_BLOCK). */
  extraBlocked: string[];
  /** Absent: no gateway listens and nothing is redirected; a gateway sandbox then reaches nothing on 80/443. */
  gatewayPorts?: GatewayPorts;
}

/** A sandbox's chain is named by its id (`sbx_…`), so reconcile maps a chain back to its sandbox. */
export const chainName = (sandboxId: string): string => sandboxId;

const set = (items: readonly string[]): string => `{ ${items.join(", ")} }`;
const quoted = (s: string): string => `"${s}"`;

/**
 * Collapses CIDRs nft would reject as overlapping elements of one anonymous interval set:
 * a block inside another is dropped.
 */
export function mergeCidrs(items: readonly string[]): string[] {
  const parsed = items.map(parseCidr).sort((a, b) => a.prefix - b.prefix || a.base - b.base);
  const kept: Cidr[] = [];
  for (const c of parsed) if (!kept.some((k) => k.prefix <= c.prefix && cidrContains(k, c.base))) kept.push(c);
  return kept.map(formatCidr);
}

/**
 * Creates the table and its base chains if missing and rewrites the base chains' rules. Per-sandbox
 * chains and map elements are left alone (reconcile removes the orphans among them).
 */
export function renderBase(b: BaseRules): string {
  const table = nftTable(b.tag);
  const wildcards = ifaceWildcards(b.tag);
  const blockedLine = `ip daddr ${set(mergeCidrs([...PRIVATE_RANGES, b.pool, ...b.extraBlocked]))} goto refuse`;
  const fixedLine = `ip daddr ${set(mergeCidrs([...NEVER_OPEN, b.pool]))} goto refuse`;
  return (
    [
      `add table ${table}`,
      `add map ${table} egress { type ifname : verdict; }`,
      `add set ${table} ${GATEWAY_SET} { type ifname . ipv4_addr; }`,
      `add chain ${table} refuse`,
      `add chain ${table} blocked`,
      `add chain ${table} fixed`,
      `add chain ${table} forward { type filter hook forward priority filter; policy accept; }`,
      `add chain ${table} input { type filter hook input priority filter; policy accept; }`,
      `add chain ${table} postrouting { type nat hook postrouting priority srcnat; policy accept; }`,
      `add chain ${table} prerouting { type nat hook prerouting priority dstnat; policy accept; }`,
      ...["refuse", "blocked", "fixed", "forward", "input", "postrouting", "prerouting"].map(
        (c) => `flush chain ${table} ${c}`,
      ),
      // IPv6 is dropped silently; IPv4 TCP gets a reset (gVisor ignores ICMP admin-prohibited).
      `add rule ${table} refuse meta nfproto ipv6 drop`,
      `add rule ${table} refuse meta l4proto tcp reject with tcp reset`,
      `add rule ${table} refuse reject with icmpx admin-prohibited`,
      `add rule ${table} blocked ${blockedLine}`,
      `add rule ${table} fixed ${fixedLine}`,
      // HTTP(S) of a gateway sandbox that was not redirected (no gateway listening) never goes out unjudged.
      `add rule ${table} forward iifname . ip saddr @${GATEWAY_SET} tcp dport { 80, 443 } goto refuse`,
      // A sandbox's traffic goes to its own chain; an interface of ours without one sends nothing.
      `add rule ${table} forward iifname vmap @egress`,
      ...wildcards.map((w) => `add rule ${table} forward iifname ${w} drop`),
      // Nothing from outside starts a connection to a sandbox.
      ...wildcards.map((w) => `add rule ${table} forward oifname ${w} ct state established,related accept`),
      ...wildcards.map((w) => `add rule ${table} forward oifname ${w} drop`),
      ...gatewayLines(table, b.gatewayPorts),
      // The host's own connections to a sandbox (the port proxy dials its address): their replies
      // come back through input. Only replies (never a sandbox's new connection), and only from the
      // address routed to the interface they came in by, so a sandbox cannot answer as another.
      ...wildcards.map(
        (w) => `add rule ${table} input iifname ${w} ct state established,related fib saddr . iif oif exists accept`,
      ),
      // Every address of the host itself, gateway included, is delivered through input: refused.
      ...wildcards.map((w) => `add rule ${table} input iifname ${w} goto refuse`),
      `add rule ${table} postrouting ip saddr ${b.pool} oifname ${quoted(b.uplink)} masquerade`,
    ].join("\n") + "\n"
  );
}

/**
 * A gateway sandbox's TCP 80 and 443 go to the proxy's ports on the host end of its link, and its
 * UDP 53 (whichever resolver it names) to the policy resolver's; input accepts exactly those
 * redirected packets (from the set's own interface and address) and refuses any other to those
 * ports, whatever its source. Other ports keep the CIDR rules.
 */
function gatewayLines(table: string, ports: GatewayPorts | undefined): string[] {
  if (!ports) return [];
  const match = `iifname . ip saddr @${GATEWAY_SET}`;
  const dns =
    ports.dns === undefined
      ? []
      : [
          `add rule ${table} prerouting ${match} udp dport 53 redirect to :${ports.dns}`,
          `add rule ${table} input ${match} ct status dnat udp dport ${ports.dns} accept`,
          `add rule ${table} input udp dport ${ports.dns} goto refuse`,
        ];
  return [
    `add rule ${table} prerouting ${match} tcp dport 80 redirect to :${ports.http}`,
    `add rule ${table} prerouting ${match} tcp dport 443 redirect to :${ports.https}`,
    `add rule ${table} input ${match} ct status dnat tcp dport { ${ports.http}, ${ports.https} } accept`,
    `add rule ${table} input tcp dport { ${ports.http}, ${ports.https} } goto refuse`,
    ...dns,
  ];
}

/** A sandbox's element of the gateway set, as nft writes it. */
export const gatewayElement = (iface: string, guest: string): string => `${quoted(iface)} . ${guest}`;

/**
 * One sandbox's chain: no IPv6, no spoofed sources, replies to its own connections, then the
 * fixed refusals (every other sandbox, loopback, 0/8) that no policy lifts, `allow_out` (wins over
 * what follows), `deny_out`, the private ranges, and the rest only when `internet` is on.
 */
export function renderSandboxAdd(r: SandboxRules): string {
  const table = r.table;
  const chain = chainName(r.sandboxId);
  const lines = [
    `add chain ${table} ${chain}`,
    `flush chain ${table} ${chain}`,
    `add rule ${table} ${chain} meta nfproto ipv6 drop`,
    `add rule ${table} ${chain} ip saddr != ${r.guest} drop`,
    `add rule ${table} ${chain} ct state established,related accept`,
    `add rule ${table} ${chain} jump fixed`,
  ];
  if (r.policy.allowOut.length > 0)
    lines.push(`add rule ${table} ${chain} ip daddr ${set(mergeCidrs(r.policy.allowOut))} accept`);
  if (r.policy.denyOut.length > 0)
    lines.push(`add rule ${table} ${chain} ip daddr ${set(mergeCidrs(r.policy.denyOut))} goto refuse`);
  lines.push(`add rule ${table} ${chain} jump blocked`);
  lines.push(r.policy.internet ? `add rule ${table} ${chain} accept` : `add rule ${table} ${chain} goto refuse`);
  lines.push(`add element ${table} egress { ${quoted(r.iface)} : goto ${chain} }`);
  if (r.policy.gateway) lines.push(`add element ${table} ${GATEWAY_SET} { ${gatewayElement(r.iface, r.guest)} }`);
  return lines.join("\n") + "\n";
}

/** Removes what exists of one sandbox's rules (nft 1.0.6 has no `destroy`: delete only what is there). */
export function renderSandboxRemove(
  table: string,
  sandboxId: string,
  mapKeys: readonly string[],
  hasChain: boolean,
  gatewayKeys: ReadonlyArray<{ iface: string; guest: string }> = [],
): string {
  const chain = chainName(sandboxId);
  const lines = mapKeys.map((k) => `delete element ${table} egress { ${quoted(k)} }`);
  for (const g of gatewayKeys)
    lines.push(`delete element ${table} ${GATEWAY_SET} { ${gatewayElement(g.iface, g.guest)} }`);
  if (hasChain) lines.push(`delete chain ${table} ${chain}`);
  return lines.length > 0 ? lines.join("\n") + "\n" : "";
}
