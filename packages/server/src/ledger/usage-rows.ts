import { sqlStates } from "../sandboxes/lifecycle.ts";
import { all, get, run, transaction, type Step } from "./sql-step.ts";

export interface OwnerUsageRow {
  owner: string;
  month: string;
  vcpu_seconds: number;
  gib_seconds: number;
  /** Comma-separated kinds of budget warning already given this month. */
  warned: string;
}

export interface DayUsageRow {
  owner: string;
  /** UTC, `2026-12-03`. */
  day: string;
  vcpu_seconds: number;
  gib_seconds: number;
}

export interface SandboxUsageRow {
  sandbox_id: string;
  vcpu_seconds: number;
  gib_seconds: number;
}

export interface UsageEntry {
  sandboxId: string;
  owner: string;
  month: string;
  /** The UTC day the seconds are counted in (`2026-12-03`). */
  day: string;
  vcpuSeconds: number;
  gibSeconds: number;
}

/** Metered usage: per sandbox, per owner and month (tables of migration 7), and per owner and day (18). */
export class UsageQueries {
  /** Adds metered usage: per sandbox, per owner and month, and per owner and day, in one transaction. */
  *addUsage(entries: readonly UsageEntry[]): Step<void> {
    yield* transaction(function* () {
      for (const e of entries) {
        yield* run(
          `INSERT INTO usage_sandbox (sandbox_id, owner, vcpu_seconds, gib_seconds) VALUES (?, ?, ?, ?)
           ON CONFLICT(sandbox_id) DO UPDATE SET vcpu_seconds = usage_sandbox.vcpu_seconds + excluded.vcpu_seconds, gib_seconds = usage_sandbox.gib_seconds + excluded.gib_seconds`,
          [e.sandboxId, e.owner, e.vcpuSeconds, e.gibSeconds],
        );
        yield* run(
          `INSERT INTO usage_owner (owner, month, vcpu_seconds, gib_seconds) VALUES (?, ?, ?, ?)
           ON CONFLICT(owner, month) DO UPDATE SET vcpu_seconds = usage_owner.vcpu_seconds + excluded.vcpu_seconds, gib_seconds = usage_owner.gib_seconds + excluded.gib_seconds`,
          [e.owner, e.month, e.vcpuSeconds, e.gibSeconds],
        );
        yield* run(
          `INSERT INTO usage_day (owner, day, vcpu_seconds, gib_seconds) VALUES (?, ?, ?, ?)
           ON CONFLICT(owner, day) DO UPDATE SET vcpu_seconds = usage_day.vcpu_seconds + excluded.vcpu_seconds, gib_seconds = usage_day.gib_seconds + excluded.gib_seconds`,
          [e.owner, e.day, e.vcpuSeconds, e.gibSeconds],
        );
      }
    });
  }

  *ownerUsage(month: string): Step<OwnerUsageRow[]> {
    return yield* all<OwnerUsageRow>(`SELECT * FROM usage_owner WHERE month = ? ORDER BY owner`, [month]);
  }

  /** Every owner's usage per day from `fromDay` on (inclusive), by day then owner. */
  *dayUsage(fromDay: string): Step<DayUsageRow[]> {
    return yield* all<DayUsageRow>(
      `SELECT owner, day, vcpu_seconds, gib_seconds FROM usage_day WHERE day >= ? ORDER BY day, owner`,
      [fromDay],
    );
  }

  *sandboxUsage(sandboxId: string): Step<{ vcpu_seconds: number; gib_seconds: number } | undefined> {
    return yield* get<{ vcpu_seconds: number; gib_seconds: number }>(
      `SELECT vcpu_seconds, gib_seconds FROM usage_sandbox WHERE sandbox_id = ?`,
      [sandboxId],
    );
  }

  /**
   * The metered usage of every sandbox not yet over, of one tenant (`undefined`: every tenant), in
   * one query: the dashboard's list shows it per row. A sandbox metered nothing yet has no row.
   */
  *liveSandboxUsage(tenant: string | undefined): Step<SandboxUsageRow[]> {
    const live = `SELECT u.sandbox_id, u.vcpu_seconds, u.gib_seconds FROM usage_sandbox u
      JOIN sandboxes s ON s.id = u.sandbox_id WHERE s.state NOT IN (${sqlStates("final")})`;
    return yield* tenant === undefined
      ? all<SandboxUsageRow>(`${live} ORDER BY u.sandbox_id`)
      : all<SandboxUsageRow>(`${live} AND s.tenant = ? ORDER BY u.sandbox_id`, [tenant]);
  }

  /** Records that an owner was warned about `kind` this month; false when it already was. */
  *markWarned(owner: string, month: string, kind: string): Step<boolean> {
    return yield* transaction(function* () {
      const row = yield* get<{ warned: string }>(
        `SELECT warned FROM usage_owner WHERE owner = ? AND month = ? FOR UPDATE`,
        [owner, month],
      );
      const warned = new Set((row?.warned ?? "").split(",").filter(Boolean));
      if (warned.has(kind)) return false;
      warned.add(kind);
      yield* run(`UPDATE usage_owner SET warned = ? WHERE owner = ? AND month = ?`, [
        [...warned].join(","),
        owner,
        month,
      ]);
      return true;
    });
  }
}
