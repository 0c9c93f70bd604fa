import { createHash } from "node:crypto";
import type { NodeLoad } from "../ledger/placement-rows.ts";

/** What a create asks of the node it lands on (what the receiving node can read of its body). */
export interface PlacementNeed {
  /** Undefined: each node's default driver. */
  driver: string | undefined;
  template: string;
  vcpu: number;
  memoryMib: number;
  /**
   * The create's Idempotency-Key, when it has one: the choice is then the same on every node that
   * sees the key at once (rendezvous hashing over the eligible nodes), so they send it to one node,
   * which makes one sandbox for it.
   */
  key: string | undefined;
}

/** How many random candidates are weighed (E2B's orchestrator weighs a few rather than all). */
export const CANDIDATES = 3;

/**
 * Chooses the node a create goes to among the live ones: not drained, with the driver, a free slot
 * and the template built (or, when none has it built, any with the driver: it builds it there);
 * then the best of `CANDIDATES` random ones by free memory and CPU, as shares of what each offers.
 * Undefined when no node can take it (the receiving node then answers the create itself, and its
 * refusal says why).
 */
export function place(
  nodes: readonly NodeLoad[],
  need: PlacementNeed,
  random: () => number = Math.random,
): NodeLoad | undefined {
  const open = nodes.filter(
    (n) =>
      !n.lapsed &&
      !n.draining &&
      n.used_slots < n.slots &&
      (need.driver === undefined || n.drivers.includes(need.driver)),
  );
  const built = open.filter((n) => n.templates.includes(need.template));
  const eligible = built.length > 0 ? built : open;
  if (eligible.length === 0) return undefined;
  if (need.key !== undefined) return rendezvous(eligible, need.key);
  return bestOf(sample(eligible, CANDIDATES, random), need);
}

/** Free memory and CPU after this create, as shares of the node's, summed: higher is emptier. */
function score(n: NodeLoad, need: PlacementNeed): number {
  const share = (offered: number, used: number, asked: number): number =>
    offered > 0 ? (offered - used - asked) / offered : 0;
  return share(n.memory_mib, n.used_memory_mib, need.memoryMib) + share(n.vcpu, n.used_vcpu, need.vcpu);
}

function bestOf(candidates: NodeLoad[], need: PlacementNeed): NodeLoad | undefined {
  let best: NodeLoad | undefined;
  for (const n of candidates) if (best === undefined || score(n, need) > score(best, need)) best = n;
  return best;
}

/** Up to `k` distinct members of `all`, chosen at random (a partial Fisher-Yates shuffle). */
function sample<T>(all: readonly T[], k: number, random: () => number): T[] {
  const pool = [...all];
  const n = Math.min(k, pool.length);
  for (let i = 0; i < n; i++) {
    const j = i + Math.floor(random() * (pool.length - i));
    [pool[i], pool[j]] = [pool[j] as T, pool[i] as T];
  }
  return pool.slice(0, n);
}

/** The node whose hash with `key` is highest: every node choosing among the same set chooses the same. */
function rendezvous(nodes: readonly NodeLoad[], key: string): NodeLoad | undefined {
  let best: { node: NodeLoad; weight: string } | undefined;
  for (const node of nodes) {
    const weight = createHash("sha256").update(`${node.id}\n${key}`).digest("hex");
    if (best === undefined || weight > best.weight) best = { node, weight };
  }
  return best?.node;
}
