/**
 * Per-tenant quotas, checked when a sandbox is made: live sandboxes, their total vCPU and
 * memory, creates per minute, and (with BOTHY_BUDGET_ACTION=block) the monthly budget; and when
 * a volume or snapshot is made, the total size of the tenant's volumes and snapshots.
 */
import { BothyError, tenantQuota, type TenantQuota } from "@bothy/protocol";
import type { Config } from "../config.ts";
import type { LedgerStore } from "../ledger/store.ts";
import type { Budget } from "../metering/usage-meter.ts";

const MINUTE_MS = 60_000;

function exceeded(tenant: string, quota: keyof TenantQuota, limit: number, what: string): BothyError {
  return new BothyError(
    "quota_exceeded",
    `Tenant ${tenant} is at its ${quota} quota of ${limit} (${what}); delete sandboxes, wait, or ask an admin to raise it (bothy tenants quota).`,
    { details: { quota, limit } },
  );
}

export class Quotas {
  constructor(
    private readonly ledger: LedgerStore,
    private readonly config: Config,
  ) {}

  async quotaOf(tenant: string): Promise<TenantQuota> {
    const row = await this.ledger.auth.tenant(tenant);
    if (!row) return {};
    const parsed = tenantQuota.safeParse(JSON.parse(row.quota));
    return parsed.success ? parsed.data : {};
  }

  /** A tenant's monthly caps: its own, else the host-wide BOTHY_BUDGET_*. */
  async budgetOf(tenant: string): Promise<Budget> {
    const q = await this.quotaOf(tenant);
    return {
      vcpuHours: q.monthly_vcpu_hours ?? this.config.metering.budget.vcpuHours,
      gibHours: q.monthly_gib_hours ?? this.config.metering.budget.gibHours,
    };
  }

  /**
   * Throws quota_exceeded if `mib` more (a volume's size, a snapshot's bytes) would take the
   * tenant, at `usedMib` of volumes and snapshots now, past max_storage_mib.
   */
  async admitStorage(
    tenant: string,
    usedMib: number,
    mib: number,
    what: "volume" | "snapshot" = "volume",
  ): Promise<void> {
    const limit = (await this.quotaOf(tenant)).max_storage_mib;
    if (limit != null && usedMib + mib > limit)
      throw new BothyError(
        "quota_exceeded",
        `Tenant ${tenant} is at its max_storage_mib quota of ${limit} (${usedMib} MiB of volumes and snapshots, ${mib} asked for a ${what}); delete volumes or snapshots, or ask an admin to raise it (bothy tenants quota).`,
        { details: { quota: "max_storage_mib", limit } },
      );
  }

  /**
   * Throws quota_exceeded if a sandbox of this size (`count` of them: a fork's children, all
   * admitted or none) would take the tenant past a quota.
   */
  async admit(
    tenant: string,
    size: { vcpu: number; memoryMib: number; count?: number },
    now = Date.now(),
  ): Promise<void> {
    const q = await this.quotaOf(tenant);
    const live = await this.ledger.auth.liveUsage(tenant);
    const n = size.count ?? 1;
    const vcpu = size.vcpu * n;
    const memoryMib = size.memoryMib * n;
    if (q.max_sandboxes != null && live.sandboxes + n > q.max_sandboxes)
      throw exceeded(tenant, "max_sandboxes", q.max_sandboxes, `${live.sandboxes} live, ${n} asked`);
    if (q.max_vcpu != null && live.vcpu + vcpu > q.max_vcpu)
      throw exceeded(tenant, "max_vcpu", q.max_vcpu, `${live.vcpu} in use, ${vcpu} asked`);
    if (q.max_memory_mib != null && live.memory_mib + memoryMib > q.max_memory_mib)
      throw exceeded(tenant, "max_memory_mib", q.max_memory_mib, `${live.memory_mib} MiB in use, ${memoryMib} asked`);
    if (q.creates_per_minute != null) {
      const recent = await this.ledger.auth.createsSince(tenant, new Date(now - MINUTE_MS).toISOString());
      if (recent + n > q.creates_per_minute)
        throw exceeded(tenant, "creates_per_minute", q.creates_per_minute, `${recent} in the last minute`);
    }
    if (this.config.metering.budgetAction === "block") {
      const budget = await this.budgetOf(tenant);
      const month = new Date(now).toISOString().slice(0, 7);
      const used = (await this.ledger.ownerUsage(month)).find((o) => o.owner === tenant);
      const vcpuHours = (used?.vcpu_seconds ?? 0) / 3600;
      const gibHours = (used?.gib_seconds ?? 0) / 3600;
      if (budget.vcpuHours !== undefined && vcpuHours >= budget.vcpuHours)
        throw exceeded(tenant, "monthly_vcpu_hours", budget.vcpuHours, `${vcpuHours.toFixed(2)} used this month`);
      if (budget.gibHours !== undefined && gibHours >= budget.gibHours)
        throw exceeded(tenant, "monthly_gib_hours", budget.gibHours, `${gibHours.toFixed(2)} used this month`);
    }
  }
}
