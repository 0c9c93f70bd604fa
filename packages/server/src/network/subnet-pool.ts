/**
 * The pool of sandbox subnets (BOTHY_NET_POOL carved into /30s): which sandbox holds which index,
 * and from an address which sandbox it is. Pure bookkeeping, no host command: host-network.ts
 * makes the links and rules for what this hands out.
 */
import { BothyError } from "@bothy/protocol";
import { formatCidr, parseCidr, parseIpv4, poolCapacity, subnetAt, type Cidr, type SandboxSubnet } from "./ipv4.ts";

export class SubnetPool {
  readonly cidr: Cidr;
  readonly capacity: number;
  /** Subnet index per sandbox; an index is free again only once `free` is called for its sandbox. */
  private readonly used = new Map<string, number>();

  constructor(pool: string) {
    this.cidr = parseCidr(pool);
    this.capacity = poolCapacity(this.cidr);
  }

  /** The sandbox's subnet: the one it holds, else the lowest free one (index 0 is never given). */
  allocate(sandboxId: string): SandboxSubnet {
    let index = this.used.get(sandboxId);
    if (index === undefined) {
      const taken = new Set(this.used.values());
      // Index 0 would put the gateway on the pool's first address; leave it out for readability.
      for (let i = 1; i < this.capacity; i++) {
        if (!taken.has(i)) {
          index = i;
          break;
        }
      }
      if (index === undefined)
        throw new BothyError(
          "capacity_exhausted",
          `The network pool ${formatCidr(this.cidr)} has no free /30 left; delete a sandbox or give BOTHY_NET_POOL a larger block.`,
        );
      this.used.set(sandboxId, index);
    }
    return subnetAt(this.cidr, index);
  }

  /**
   * Whether the sandbox may take the subnet whose gateway (the host's end) is `gateway`: false
   * when that address is no subnet's gateway in this pool, is index 0's, or another sandbox's.
   */
  claimable(sandboxId: string, gateway: string): boolean {
    return this.claimIndex(sandboxId, gateway) !== undefined;
  }

  /** Takes that subnet, as a sandbox that outlived a restart still has it; undefined when not claimable. */
  claim(sandboxId: string, gateway: string): SandboxSubnet | undefined {
    const index = this.claimIndex(sandboxId, gateway);
    if (index === undefined) return undefined;
    this.used.set(sandboxId, index);
    return subnetAt(this.cidr, index);
  }

  private claimIndex(sandboxId: string, gateway: string): number | undefined {
    const index = (parseIpv4(gateway) - this.cidr.base - 1) / 4;
    if (!Number.isInteger(index) || index < 1 || index >= this.capacity) return undefined;
    for (const [id, i] of this.used) if (i === index && id !== sandboxId) return undefined;
    return index;
  }

  /** The sandbox's subnet, if it holds one. */
  of(sandboxId: string): SandboxSubnet | undefined {
    const index = this.used.get(sandboxId);
    return index === undefined ? undefined : subnetAt(this.cidr, index);
  }

  /** The sandbox whose guest address (the sandbox's end) this is; undefined for any other address. */
  byGuest(address: string): string | undefined {
    let addr: number;
    try {
      addr = parseIpv4(address.replace(/^::ffff:/, ""));
    } catch {
      return undefined;
    }
    const index = (addr - this.cidr.base - 2) / 4;
    if (!Number.isInteger(index)) return undefined;
    for (const [sandboxId, i] of this.used) if (i === index) return sandboxId;
    return undefined;
  }

  /** Gives the sandbox's subnet back; a no-op for one that holds none. */
  free(sandboxId: string): void {
    this.used.delete(sandboxId);
  }
}
