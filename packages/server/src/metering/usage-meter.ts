import type { UsageDaysBody } from "@bothy/protocol";
import type { EventBus } from "../events/event-bus.ts";
import type { SandboxRow } from "../ledger/sandbox-rows.ts";
import type { Asynced } from "../ledger/sql-step.ts";
import type { LedgerStore } from "../ledger/store.ts";
import type { UsageQueries } from "../ledger/usage-rows.ts";
import type { Logger } from "../sandboxes/sandbox-manager.ts";

export interface Budget {
  vcpuHours: number | undefined;
  gibHours: number | undefined;
}

export interface MeterOptions {
  intervalMs: number;
  /** Monthly caps; crossing one warns once per owner (tenant) and month. */
  budget: Budget;
  /** A tenant's own caps, over the host-wide `budget`. */
  budgetOf?: (owner: string) => Promise<Budget>;
  /** The sandboxes running now (default: the ledger's running rows; a cluster's leader: as readers see them). */
  running?: () => Promise<SandboxRow[]>;
}

/**
 * How a tick writes: straight to the ledger on one machine; in a cluster, fenced by the leader's
 * epoch (cluster/leader-jobs.ts), so a leader that lost its lease counts nothing twice.
 */
export type UsageWrites = Pick<Asynced<UsageQueries>, "addUsage" | "markWarned">;

export interface UsageReport {
  month: string;
  owners: Array<{
    owner: string;
    vcpu_hours: number;
    gib_hours: number;
    budget: { vcpu_hours: number | null; gib_hours: number | null };
    over_budget: string[];
  }>;
}

/**
 * Meters vCPU-seconds and GiB-seconds of memory of every running sandbox (a paused or deleted
 * one costs nothing), per sandbox and per owner (its tenant) and month, in the ledger. When an owner's month
 * crosses a budget, it warns once: a warning log line, a `budget.exceeded` event (and so the
 * webhook, with its retries).
 */
export class UsageMeter {
  private last = Date.now();
  private timer: NodeJS.Timeout | undefined;
  /** Ticks run one after another (the timer's, a report's, the last one at stop). */
  private ticking: Promise<void> = Promise.resolve();

  constructor(
    private readonly ledger: LedgerStore,
    private readonly events: EventBus,
    private readonly opts: MeterOptions,
    private readonly warn: Logger,
  ) {}

  start(): void {
    // A failed tick is logged (`tick`); the next one counts its time too.
    this.timer = setInterval(() => void this.tick().catch(() => undefined), this.opts.intervalMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.tick();
  }

  /** Adds the time since the last tick for every running sandbox, then checks the budgets. */
  tick(now = Date.now(), writes: UsageWrites = this.ledger): Promise<void> {
    const next = this.ticking.then(() => this.tickNow(now, writes));
    this.ticking = next.catch((err: unknown) =>
      this.warn("ledger_write_failed", { what: "usage", sandbox_id: null, error: (err as Error).message }),
    );
    return next;
  }

  /** Counts from `now` on, nothing before: a node that has just become the leader meters from its first run. */
  restartClock(now = Date.now()): void {
    this.last = now;
  }

  private async tickNow(now: number, writes: UsageWrites): Promise<void> {
    // Counted from the last tick that ran, up to this one's time (a late tick counts nothing twice).
    const seconds = Math.max(0, (now - this.last) / 1000);
    this.last = Math.max(this.last, now);
    const month = monthOf(now);
    const running = (await (this.opts.running?.() ?? this.ledger.liveSandboxes())).filter((r) => r.state === "running");
    if (running.length > 0 && seconds > 0) {
      await writes.addUsage(
        running.map((r) => ({
          sandboxId: r.id,
          owner: r.tenant,
          month,
          day: dayOf(now),
          vcpuSeconds: r.vcpu * seconds,
          gibSeconds: (r.memory_mib / 1024) * seconds,
        })),
      );
    }
    for (const owner of (await this.report(now)).owners) {
      for (const kind of owner.over_budget) {
        if (!(await writes.markWarned(owner.owner, month, kind))) continue;
        const data = {
          owner: owner.owner,
          month,
          kind,
          vcpu_hours: owner.vcpu_hours,
          gib_hours: owner.gib_hours,
          budget: owner.budget,
        };
        this.warn("budget_exceeded", data);
        await this.events.publish("budget.exceeded", null, data, owner.owner);
      }
    }
  }

  /**
   * Hours per owner and UTC day over the last `n` days, today included. A tick's seconds count on
   * the day it ran, so a tick across midnight puts its few seconds on the new day.
   */
  async days(n: number, now = Date.now()): Promise<UsageDaysBody> {
    const from = dayOf(now - (n - 1) * 86_400_000);
    return {
      from,
      days: (await this.ledger.dayUsage(from)).map((d) => ({
        day: d.day,
        owner: d.owner,
        vcpu_hours: d.vcpu_seconds / 3600,
        gib_hours: d.gib_seconds / 3600,
      })),
    };
  }

  async report(now = Date.now()): Promise<UsageReport> {
    const month = monthOf(now);
    const rows = await this.ledger.ownerUsage(month);
    const budgets = await Promise.all(rows.map((o) => this.opts.budgetOf?.(o.owner) ?? this.opts.budget));
    return {
      month,
      owners: rows.map((o, i) => {
        const { vcpuHours, gibHours } = budgets[i] ?? this.opts.budget;
        const vcpu = o.vcpu_seconds / 3600;
        const gib = o.gib_seconds / 3600;
        return {
          owner: o.owner,
          vcpu_hours: vcpu,
          gib_hours: gib,
          budget: { vcpu_hours: vcpuHours ?? null, gib_hours: gibHours ?? null },
          over_budget: [
            ...(vcpuHours !== undefined && vcpu >= vcpuHours ? ["vcpu_hours"] : []),
            ...(gibHours !== undefined && gib >= gibHours ? ["gib_hours"] : []),
          ],
        };
      }),
    };
  }
}

function dayOf(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10);
}

function monthOf(ms: number): string {
  return new Date(ms).toISOString().slice(0, 7);
}
