/**
 * Where host policies live: a tenant's default on its row, a sandbox's own (as its create asked,
 * with the secrets it names) on the sandbox's row. The effective policy is computed when asked,
 * so a change of the tenant's default applies to its sandboxes' next requests.
 */
import type { EffectiveHostPolicy } from "@bothy/protocol";
import type { z } from "zod";
import type { hostPolicyRequest } from "@bothy/protocol";
import type { SandboxRow } from "../ledger/ledger.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { effectivePolicy, parseHostPolicy } from "./host-policy.ts";

type ParsedPolicy = z.output<typeof hostPolicyRequest>;

/** What a sandbox row keeps of its create: the policy as asked for and the secrets it names. */
export interface SandboxPolicyRecord {
  policy?: ParsedPolicy;
  secrets?: string[];
}

export class GatewayPolicies {
  constructor(private readonly ledger: LedgerStore) {}

  /** The tenant's default policy, or undefined when it has none. */
  async tenantPolicy(tenant: string): Promise<ParsedPolicy | undefined> {
    const raw = await this.ledger.auth.tenantPolicy(tenant);
    return raw === null || raw === undefined ? undefined : parseHostPolicy(JSON.parse(raw));
  }

  setTenantPolicy(tenant: string, policy: ParsedPolicy | null): Promise<void> {
    return this.ledger.auth.setTenantPolicy(tenant, policy === null ? null : JSON.stringify(policy));
  }

  /** The sandbox's effective policy from its row and its tenant's default; undefined: none (no gateway). */
  ofRow(row: Pick<SandboxRow, "tenant" | "policy">): Promise<EffectiveHostPolicy | undefined> {
    return this.effective(row.tenant, recordOf(row.policy));
  }

  /** `ofRow` of each row, reading each tenant's default once (a list's rows share a few tenants). */
  async ofRows(
    rows: ReadonlyArray<Pick<SandboxRow, "tenant" | "policy">>,
  ): Promise<Array<EffectiveHostPolicy | undefined>> {
    const defaults = new Map<string, Promise<ParsedPolicy | undefined>>();
    for (const row of rows) if (!defaults.has(row.tenant)) defaults.set(row.tenant, this.tenantPolicy(row.tenant));
    return Promise.all(
      rows.map(async (row) => {
        const own = recordOf(row.policy);
        return effectivePolicy(await defaults.get(row.tenant), own.policy, own.secrets ?? []);
      }),
    );
  }

  /** As `ofRow`, for a create before its row exists. */
  async effective(tenant: string, own: SandboxPolicyRecord): Promise<EffectiveHostPolicy | undefined> {
    return effectivePolicy(await this.tenantPolicy(tenant), own.policy, own.secrets ?? []);
  }

  /** A live sandbox's effective policy, by id; undefined for an unknown sandbox or one without a policy. */
  async policyOf(sandboxId: string): Promise<EffectiveHostPolicy | undefined> {
    const row = await this.ledger.getSandbox(sandboxId);
    return row ? this.ofRow(row) : undefined;
  }
}

export function recordOf(raw: string | null | undefined): SandboxPolicyRecord {
  if (raw === null || raw === undefined) return {};
  const { policy, secrets } = JSON.parse(raw) as { policy?: unknown; secrets?: string[] };
  return { ...(policy === undefined ? {} : { policy: parseHostPolicy(policy) }), ...(secrets ? { secrets } : {}) };
}
