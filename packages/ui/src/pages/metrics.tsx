/**
 * `/metrics` at a glance (scope admin): the server's Prometheus text read in the browser and cut
 * down to the figures a person looks at: sandboxes by state, creates and how long they take,
 * commands, egress decisions, errors by code, open streams and relays. Read again every 15 s;
 * the whole text is one click away.
 */
import { useEffect } from "preact/hooks";
import { call } from "../api.ts";
import type { PageProps } from "../app.tsx";
import { byLabel, parsePrometheus, quantile, total, type Sample } from "../prom-text.ts";
import { ErrorLine, useLoad } from "../use-load.tsx";

const REFRESH_MS = 15_000;

const seconds = (s: number | null): string =>
  s === null ? "none yet" : s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(2)} s`;
const count = (n: number): string => String(Math.round(n));
const breakdown = (pairs: Array<[string, number]>): string =>
  pairs.length === 0 ? "none" : pairs.map(([k, n]) => `${k} ${count(n)}`).join(", ");

interface Figure {
  label: string;
  value: string;
  detail?: string;
}

function figures(m: readonly Sample[]): Array<{ title: string; items: Figure[] }> {
  const errors = byLabel(m, "bothy_errors_total", "code")
    .sort((a, b) => b[1] - a[1])
    .slice(0, 5);
  return [
    {
      title: "Sandboxes",
      items: [
        {
          label: "In the ledger",
          value: count(total(m, "bothy_sandboxes")),
          detail: breakdown(byLabel(m, "bothy_sandboxes", "state")),
        },
        { label: "By driver", value: breakdown(byLabel(m, "bothy_sandboxes", "driver")) },
        {
          label: "Created",
          value: count(total(m, "bothy_sandboxes_created_total")),
          detail: `${count(total(m, "bothy_sandbox_create_failures_total"))} failed to boot`,
        },
        {
          label: "Create time",
          value: `median ${seconds(quantile(m, "bothy_sandbox_create_seconds", 0.5))}`,
          detail: `95th percentile ${seconds(quantile(m, "bothy_sandbox_create_seconds", 0.95))}`,
        },
        { label: "Wake time", value: `median ${seconds(quantile(m, "bothy_sandbox_wake_seconds", 0.5))}` },
        { label: "Died on their own", value: count(total(m, "bothy_sandbox_deaths_total")) },
      ],
    },
    {
      title: "Commands and egress",
      items: [
        {
          label: "Commands started",
          value: count(total(m, "bothy_commands_started_total")),
          detail: `${count(total(m, "bothy_commands_lost_total"))} lost with their sandbox`,
        },
        {
          label: "Command start",
          value: `median ${seconds(quantile(m, "bothy_command_start_seconds", 0.5))}`,
          detail: `95th percentile ${seconds(quantile(m, "bothy_command_start_seconds", 0.95))}`,
        },
        {
          label: "Egress decisions",
          value: breakdown(byLabel(m, "bothy_egress_decision_seconds_count", "decision")),
          detail: `median ${seconds(quantile(m, "bothy_egress_decision_seconds", 0.5))}`,
        },
      ],
    },
    {
      title: "Errors and connections",
      items: [
        { label: "Error answers", value: count(total(m, "bothy_errors_total")), detail: breakdown(errors) },
        { label: "Event streams", value: breakdown(byLabel(m, "bothy_event_streams", "state")) },
        {
          label: "Relays",
          value: breakdown(byLabel(m, "bothy_relays", "state")),
          detail: `${count(total(m, "bothy_relay_held_bytes"))} bytes held`,
        },
      ],
    },
  ];
}

export function MetricsPage(_: PageProps) {
  const metrics = useLoad(async () => {
    const text = await (await call("GET", "/metrics")).text();
    return { text, samples: parsePrometheus(text), at: new Date() };
  });
  useEffect(() => {
    const timer = setInterval(metrics.reload, REFRESH_MS);
    return () => clearInterval(timer);
  }, [metrics.reload]);
  const data = metrics.data;
  return (
    <>
      <h1>Metrics</h1>
      <div class="toolbar">
        <button type="button" class="quiet" onClick={metrics.reload}>
          Refresh
        </button>
        {data !== null && <span class="count">Read at {data.at.toLocaleTimeString()}</span>}
      </div>
      <ErrorLine error={metrics.error} />
      {data !== null &&
        figures(data.samples).map((group) => (
          <section key={group.title} aria-label={group.title} class="figures">
            <h2>{group.title}</h2>
            <dl class="cards">
              {group.items.map((f) => (
                <div key={f.label} class="card" data-figure={f.label}>
                  <dt>{f.label}</dt>
                  <dd class="value">{f.value}</dd>
                  {f.detail !== undefined && <dd class="detail">{f.detail}</dd>}
                </div>
              ))}
            </dl>
          </section>
        ))}
      {data !== null && (
        <details class="raw">
          <summary>The whole text ({data.samples.length} samples)</summary>
          <pre>{data.text}</pre>
        </details>
      )}
    </>
  );
}
