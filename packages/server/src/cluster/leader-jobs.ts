import { pruneEvents } from "../events/event-retention.ts";
import type { Logger } from "../events/server-events.ts";
import { EventQueries, type EventRetention } from "../ledger/event-rows.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { UsageQueries } from "../ledger/usage-rows.ts";
import type { UsageMeter } from "../metering/usage-meter.ts";
import type { LeaderJob } from "./leader-lease.ts";

const usage = new UsageQueries();
const events = new EventQueries();

/**
 * The cluster's work that must run once, whatever the number of nodes, as the leader's jobs
 * (leader-lease.ts), each write fenced by the leader's epoch. What stays on every node is what only
 * that node can do: its own sandboxes' expiry, idle sleep, deaths and host objects (their VMs,
 * disks and network are on it), in its sweeper.
 */

/**
 * Usage roll-ups and budgets: the leader meters every sandbox that runs in the cluster (one of a
 * node whose lease lapsed is not running as far as anyone knows, and costs nothing), adds it to the
 * tenants' months and days, and warns once per tenant and month over a budget. A node that has just
 * become the leader counts from its first run: the time since the last leader's last run (at most a
 * lease and an interval) is not metered.
 */
export function usageJob(meter: UsageMeter, intervalMs: number): LeaderJob {
  let epoch: number | undefined;
  return {
    name: "usage",
    intervalMs,
    async run(ctx) {
      if (ctx.epoch !== epoch) {
        epoch = ctx.epoch;
        meter.restartClock();
        return;
      }
      await meter.tick(Date.now(), {
        addUsage: (entries) => ctx.fenced(() => usage.addUsage(entries)),
        markWarned: (owner, month, kind) => ctx.fenced(() => usage.markWarned(owner, month, kind)),
      });
    },
  };
}

/** Event retention (BOTHY_EVENTS_RETENTION): the leader prunes the cluster's one table of events. */
export function eventRetentionJob(
  store: LedgerStore,
  retention: EventRetention,
  log: Logger,
  intervalMs: number,
): LeaderJob {
  return {
    name: "event-retention",
    intervalMs,
    async run(ctx) {
      await pruneEvents(
        {
          keptFrom: (r, now) => store.events.keptFrom(r, now),
          deleteBelow: (seq, batch) => ctx.fenced(() => events.deleteBelow(seq, batch)),
        },
        retention,
        log,
      );
    },
  };
}
