/**
 * Who is behind a connection's source address: the gateway sandbox (its tenant, CIDR posture and
 * effective host policy as of now), and the ranges no sandbox may reach. The egress gateway asks
 * it on each connection and each request, so a policy change applies to the next request.
 */
import type { EffectiveHostPolicy } from "@bothy/protocol";
import type { HostNetwork } from "../network/host-network.ts";
import type { LedgerStore } from "../ledger/store.ts";
import type { GatewayPolicies } from "./policies.ts";
import type { GatewaySandbox } from "./contracts.ts";

/** Who is behind a source address: a gateway sandbox, and the ranges no sandbox may reach. */
export interface SandboxLookup {
  sandboxOf(address: string): Promise<GatewaySandbox | undefined>;
  /** PRIVATE_RANGES, the pool and BOTHY_NET_BLOCK. */
  blocked(): readonly string[];
  /** Refused even when `allow_out` names it: loopback, 0/8, the pool and the host's own addresses. */
  unreachable?(): readonly string[];
}

/** The policy of a gateway sandbox whose host rules were all removed since it started: everything allowed. */
const allowAll = (): EffectiveHostPolicy => ({ rules: [], default: "allow", tools: {}, secrets: [] });

/**
 * Looks up the gateway sandbox behind a guest address: the network's plan says which sandbox and
 * its CIDR posture, the ledger its tenant, the policies its effective host policy as of now.
 */
export function gatewayLookup(
  network: Pick<HostNetwork, "byGuest" | "blocked" | "unreachable">,
  ledger: Pick<LedgerStore, "getSandbox">,
  policies: Pick<GatewayPolicies, "ofRow">,
): SandboxLookup {
  return {
    async sandboxOf(address) {
      const hit = network.byGuest(address);
      if (!hit?.policy.gateway) return undefined;
      const row = await ledger.getSandbox(hit.sandboxId);
      if (!row) return undefined;
      return {
        sandboxId: hit.sandboxId,
        tenant: row.tenant,
        allowOut: hit.policy.allowOut,
        denyOut: hit.policy.denyOut,
        internet: hit.policy.internet,
        policy: (await policies.ofRow(row)) ?? allowAll(),
      };
    },
    blocked: () => network.blocked,
    unreachable: () => network.unreachable,
  };
}
