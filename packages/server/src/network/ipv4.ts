/** IPv4 addresses and CIDR blocks as numbers: parsing, normalizing, carving a pool into subnets. */
import { BothyError, IPV4_CIDR_RE } from "@bothy/protocol";

export interface Cidr {
  /** The network address (host bits cleared), as an unsigned 32-bit number. */
  base: number;
  prefix: number;
}

export function parseIpv4(text: string): number {
  const parts = text.split(".").map(Number);
  if (parts.length !== 4 || parts.some((p) => !Number.isInteger(p) || p < 0 || p > 255))
    throw new BothyError("invalid_request", `"${text}" is not an IPv4 address.`);
  return parts.reduce((acc, p) => acc * 256 + p, 0);
}

export function formatIpv4(n: number): string {
  return [24, 16, 8, 0].map((shift) => Math.floor(n / 2 ** shift) % 256).join(".");
}

const maskOf = (prefix: number): number => (prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0);

/** `a.b.c.d` or `a.b.c.d/n`, host bits cleared: `10.1.2.3/8` becomes 10.0.0.0/8. */
export function parseCidr(text: string): Cidr {
  if (!IPV4_CIDR_RE.test(text))
    throw new BothyError("invalid_request", `"${text}" is not an IPv4 address or CIDR block (IPv6 is always blocked).`);
  const [addr = "", len] = text.split("/");
  const prefix = len === undefined ? 32 : Number(len);
  return { base: (parseIpv4(addr) & maskOf(prefix)) >>> 0, prefix };
}

export function formatCidr(c: Cidr): string {
  return `${formatIpv4(c.base)}/${c.prefix}`;
}

/** The canonical text of a CIDR: host bits cleared, `/32` spelled out. */
export function normalizeCidr(text: string): string {
  return formatCidr(parseCidr(text));
}

export function cidrContains(c: Cidr, addr: number): boolean {
  return (addr & maskOf(c.prefix)) >>> 0 === c.base;
}

export function cidrsOverlap(a: Cidr, b: Cidr): boolean {
  return cidrContains(a, b.base) || cidrContains(b, a.base);
}

/** Each sandbox's link is a /30: network, gateway (the host's end), guest, broadcast. */
export const SUBNET_PREFIX = 30;

export interface SandboxSubnet {
  index: number;
  gateway: string;
  guest: string;
  prefix: number;
}

/** How many /30 subnets the pool holds. */
export function poolCapacity(pool: Cidr): number {
  if (pool.prefix > SUBNET_PREFIX)
    throw new BothyError(
      "internal",
      `The network pool ${formatCidr(pool)} is smaller than one /30; use a /30 or larger block for BOTHY_NET_POOL.`,
    );
  return 2 ** (SUBNET_PREFIX - pool.prefix);
}

export function subnetAt(pool: Cidr, index: number): SandboxSubnet {
  const base = pool.base + index * 4;
  return { index, gateway: formatIpv4(base + 1), guest: formatIpv4(base + 2), prefix: SUBNET_PREFIX };
}
