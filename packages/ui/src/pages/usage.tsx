/**
 * Usage (GET /usage and /usage/days): this month's metered vCPU and memory hours per tenant
 * against its budget, as charts of the running total by day and as a table with the share of
 * each budget used. A key sees its own tenant; an admin key every tenant.
 */
import type { UsageDaysBody, UsageReportBody } from "@bothy/protocol";
import { useMemo } from "preact/hooks";
import { getJson } from "../api.ts";
import type { PageProps } from "../app.tsx";
import { colourOf, UsageChart, type ChartLine } from "../components/usage-chart.tsx";
import { ErrorLine, useLoad } from "../use-load.tsx";
import { ScrollBox } from "../components/scroll-box.tsx";

const DAY_S = 86_400;
const hours = (n: number): string => (n < 10 ? n.toFixed(3) : n.toFixed(1));

/** The UTC days of this month up to today, as unix seconds, and the month's day names. */
function monthDays(month: string): { days: number[]; names: string[] } {
  const first = Date.parse(`${month}-01T00:00:00Z`) / 1000;
  const today = Math.floor(Date.now() / 1000 / DAY_S) * DAY_S;
  const days: number[] = [];
  for (let t = first; t <= today; t += DAY_S) days.push(t);
  return { days, names: days.map((t) => new Date(t * 1000).toISOString().slice(0, 10)) };
}

function lines(
  report: UsageReportBody,
  perDay: UsageDaysBody,
  names: string[],
  pick: "vcpu_hours" | "gib_hours",
): ChartLine[] {
  const owners = [...new Set([...report.owners.map((o) => o.owner), ...perDay.days.map((d) => d.owner)])].sort();
  return owners.map((owner) => {
    let sum = 0;
    const cumulative = names.map((day) => {
      sum += perDay.days.find((d) => d.owner === owner && d.day === day)?.[pick] ?? 0;
      return sum;
    });
    const budget = report.owners.find((o) => o.owner === owner)?.budget[pick] ?? null;
    return { owner, cumulative, budget };
  });
}

function Share({ used, budget, label }: { used: number; budget: number | null; label: string }) {
  if (budget === null) return <>{hours(used)} (no budget)</>;
  return (
    <>
      {hours(used)} of {hours(budget)}{" "}
      <meter aria-label={label} min={0} max={budget} high={budget * 0.8} optimum={0} value={Math.min(used, budget)} />{" "}
      {Math.round((used / budget) * 100)}%
    </>
  );
}

export function UsagePage(_: PageProps) {
  const usage = useLoad(() =>
    Promise.all([getJson<UsageReportBody>("/usage"), getJson<UsageDaysBody>("/usage/days?days=31")]),
  );
  const chart = useMemo(() => {
    if (!usage.data) return null;
    const [report, perDay] = usage.data;
    const { days, names } = monthDays(report.month);
    return {
      month: report.month,
      days,
      vcpu: lines(report, perDay, names, "vcpu_hours"),
      gib: lines(report, perDay, names, "gib_hours"),
    };
  }, [usage.data]);
  const report = usage.data?.[0];
  return (
    <>
      <h1>Usage</h1>
      <div class="toolbar">
        <button type="button" class="quiet" onClick={usage.reload}>
          Refresh
        </button>
        {chart !== null && <span class="count">{chart.month}, metered while sandboxes run (UTC days)</span>}
      </div>
      <ErrorLine error={usage.error} />
      {chart !== null && chart.vcpu.length === 0 && <p class="empty">Nothing metered this month yet.</p>}
      {chart !== null && chart.vcpu.length > 0 && (
        <div class="charts">
          <UsageChart title="vCPU hours this month" unit="vCPU h" days={chart.days} lines={chart.vcpu} />
          <UsageChart title="Memory GiB hours this month" unit="GiB h" days={chart.days} lines={chart.gib} />
        </div>
      )}
      {report !== undefined && report.owners.length > 0 && (
        <ScrollBox label="Usage by tenant">
          <table class="list">
            <thead>
              <tr>
                <th scope="col">Tenant</th>
                <th scope="col">vCPU hours</th>
                <th scope="col">GiB hours</th>
                <th scope="col">Over budget</th>
              </tr>
            </thead>
            <tbody>
              {report.owners.map((o, i) => (
                <tr key={o.owner} data-owner={o.owner}>
                  <td>
                    <span class="swatch" style={{ background: colourOf(i) }} aria-hidden="true" />
                    {o.owner}
                  </td>
                  <td>
                    <Share used={o.vcpu_hours} budget={o.budget.vcpu_hours} label={`${o.owner} vCPU hours of budget`} />
                  </td>
                  <td>
                    <Share used={o.gib_hours} budget={o.budget.gib_hours} label={`${o.owner} GiB hours of budget`} />
                  </td>
                  <td>{o.over_budget.length === 0 ? "no" : o.over_budget.join(", ")}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </ScrollBox>
      )}
    </>
  );
}
