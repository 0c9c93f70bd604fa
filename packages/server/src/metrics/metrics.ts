import type { RelayGauges } from "../api/relay-meter.ts";
import type { EventStreamGauges } from "../events/event-streams.ts";
import type { ServerEvent } from "../events/server-events.ts";
import { SANDBOX_STATES } from "@bothy/protocol";

/**
 * Counters and a histogram in the Prometheus text exposition format (version 0.0.4), written by
 * hand: bothy needs a handful of series, not a client library. Lifecycle numbers come from the
 * events the manager, sweeper and command registry already log (`observe`), so no part of the
 * server needs to know about metrics; gauges are read at scrape time.
 */

/** Create latency buckets in seconds: gVisor warm starts are well under 1 s, cold QEMU under TCG ~5-10 s. */
const CREATE_BUCKETS = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

type Labels = Record<string, string>;

class Counter {
  private readonly values = new Map<string, { labels: Labels; value: number }>();

  /** `seed`: label sets shown as 0 before anything is counted; none means one series without labels. */
  constructor(
    readonly name: string,
    readonly help: string,
    seed: Labels[] = [{}],
  ) {
    for (const labels of seed) this.inc(labels, 0);
  }

  inc(labels: Labels = {}, by = 1): void {
    const key = labelText(labels);
    const entry = this.values.get(key) ?? { labels, value: 0 };
    entry.value += by;
    this.values.set(key, entry);
  }

  render(): string[] {
    const lines = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} counter`];
    for (const { labels, value } of this.values.values()) lines.push(`${this.name}${labelText(labels)} ${value}`);
    return lines;
  }
}

class Histogram {
  private readonly series = new Map<string, { labels: Labels; buckets: number[]; sum: number; count: number }>();

  constructor(
    readonly name: string,
    readonly help: string,
    private readonly bounds: number[],
  ) {}

  observe(value: number, labels: Labels = {}): void {
    const key = labelText(labels);
    const s = this.series.get(key) ?? { labels, buckets: this.bounds.map(() => 0), sum: 0, count: 0 };
    this.bounds.forEach((le, i) => {
      if (value <= le) s.buckets[i] = (s.buckets[i] ?? 0) + 1;
    });
    s.sum += value;
    s.count++;
    this.series.set(key, s);
  }

  render(): string[] {
    const lines = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} histogram`];
    for (const s of this.series.values()) {
      this.bounds.forEach((le, i) =>
        lines.push(`${this.name}_bucket${labelText({ ...s.labels, le: String(le) })} ${s.buckets[i] ?? 0}`),
      );
      lines.push(`${this.name}_bucket${labelText({ ...s.labels, le: "+Inf" })} ${s.count}`);
      lines.push(`${this.name}_sum${labelText(s.labels)} ${s.sum}`);
      lines.push(`${this.name}_count${labelText(s.labels)} ${s.count}`);
    }
    return lines;
  }
}

/** What the gauges show, read at scrape time. */
export interface Gauges {
  sandboxes: Array<{ state: string; driver: string; n: number }>;
  /** Drivers that get a series for every state, 0 when empty, so dashboards see them from the start. */
  drivers: string[];
  /** Open `GET /events` streams and what their replays read. */
  eventStreams?: EventStreamGauges;
  /** Open byte relays into sandboxes (tunnel, VNC, port WebSockets). */
  relays?: RelayGauges;
}

export class Metrics {
  private readonly createSeconds = new Histogram(
    "bothy_sandbox_create_seconds",
    "Time from create request to a running sandbox, by driver and whether the warm pool served it.",
    CREATE_BUCKETS,
  );
  private readonly wakeSeconds = new Histogram(
    "bothy_sandbox_wake_seconds",
    "Time to start a paused or stopped sandbox again on the next call, by driver and the state it woke from.",
    CREATE_BUCKETS,
  );
  private readonly creates = new Counter("bothy_sandboxes_created_total", "Sandboxes created, by driver.", []);
  private readonly createFailures = new Counter("bothy_sandbox_create_failures_total", "Creates that failed to boot.");
  private readonly deletions = new Counter(
    "bothy_sandboxes_deleted_total",
    "Sandboxes deleted, by reason: requested, expired (the sweeper), disconnected (client gone).",
    ["requested", "expired", "disconnected"].map((reason) => ({ reason })),
  );
  private readonly deaths = new Counter(
    "bothy_sandbox_deaths_total",
    "Sandboxes that stopped on their own, by who noticed: the driver or the sweeper.",
    ["driver", "sweeper"].map((detected_by) => ({ detected_by })),
  );
  private readonly commandsStarted = new Counter("bothy_commands_started_total", "Commands started in sandboxes.");
  private readonly commandsExited = new Counter(
    "bothy_commands_exited_total",
    "Commands that exited (including killed and timed out).",
  );
  private readonly commandsLost = new Counter(
    "bothy_commands_lost_total",
    "Commands whose sandbox or agent went away before they exited.",
  );
  private readonly errors = new Counter("bothy_errors_total", "Error responses, by error code.", []);
  private readonly sweeper = new Counter(
    "bothy_sweeper_removals_total",
    "What the sweeper and start-up reconcile removed: expired sandboxes, dead sandboxes, lost ledger rows, orphan host objects.",
    ["expired", "dead", "lost", "orphan"].map((reason) => ({ reason })),
  );
  private readonly disconnects = new Counter(
    "bothy_disconnect_grace_started_total",
    "Times the last client socket of a delete_on_disconnect sandbox dropped and its grace period began.",
  );
  private readonly all = [
    this.creates,
    this.createFailures,
    this.deletions,
    this.deaths,
    this.commandsStarted,
    this.commandsExited,
    this.commandsLost,
    this.errors,
    this.sweeper,
    this.disconnects,
  ];

  /** Takes every server event; the ones that count are counted. */
  observe(ev: ServerEvent): void {
    switch (ev.event) {
      case "sandbox_created":
        this.creates.inc({ driver: ev.driver });
        this.createSeconds.observe(ev.ms / 1000, { driver: ev.driver, warm: String(ev.warm) });
        break;
      case "sandbox_woken":
        this.wakeSeconds.observe(ev.ms / 1000, { driver: ev.driver, from: ev.from });
        break;
      case "sandbox_create_failed":
        this.createFailures.inc();
        break;
      case "sandbox_deleted":
        this.deletions.inc({ reason: ev.reason });
        if (ev.reason === "expired") this.sweeper.inc({ reason: "expired" });
        break;
      case "sandbox_died": {
        const bySweeper = ev.detected_by === "sweeper";
        this.deaths.inc({ detected_by: bySweeper ? "sweeper" : "driver" });
        if (bySweeper) this.sweeper.inc({ reason: "dead" });
        break;
      }
      case "sandbox_lost":
        this.sweeper.inc({ reason: "lost" });
        break;
      case "orphan_removed":
        this.sweeper.inc({ reason: "orphan" });
        break;
      case "disconnect_grace_started":
        this.disconnects.inc();
        break;
      case "command_started":
        this.commandsStarted.inc();
        break;
      case "command_exited":
        this.commandsExited.inc();
        break;
      case "command_lost":
        this.commandsLost.inc();
        break;
    }
  }

  error(code: string): void {
    this.errors.inc({ code });
  }

  /** The whole exposition, served as `text/plain; version=0.0.4`. */
  render(gauges: Gauges): string {
    const lines = [
      "# HELP bothy_sandboxes Sandboxes in the ledger, by state and driver.",
      "# TYPE bothy_sandboxes gauge",
    ];
    const counts = new Map<string, number>();
    for (const driver of gauges.drivers)
      for (const state of SANDBOX_STATES) counts.set(labelText({ state, driver }), 0);
    for (const c of gauges.sandboxes) counts.set(labelText({ state: c.state, driver: c.driver }), c.n);
    for (const [labels, n] of counts) lines.push(`bothy_sandboxes${labels} ${n}`);
    lines.push(...this.createSeconds.render());
    lines.push(...this.wakeSeconds.render());
    for (const c of this.all) lines.push(...c.render());
    if (gauges.eventStreams) lines.push(...eventStreamLines(gauges.eventStreams));
    if (gauges.relays) lines.push(...relayLines(gauges.relays));
    return `${lines.join("\n")}\n`;
  }
}

function eventStreamLines(g: EventStreamGauges): string[] {
  return [
    "# HELP bothy_event_streams Open GET /events streams: live, replaying (paging through the ledger), or behind (waiting for a client that stopped reading).",
    "# TYPE bothy_event_streams gauge",
    `bothy_event_streams{state="live"} ${g.live}`,
    `bothy_event_streams{state="replaying"} ${g.replaying}`,
    `bothy_event_streams{state="behind"} ${g.behind}`,
    "# HELP bothy_event_stream_buffered_bytes Bytes written to event streams that their clients have not taken yet.",
    "# TYPE bothy_event_stream_buffered_bytes gauge",
    `bothy_event_stream_buffered_bytes ${g.bufferedBytes}`,
    "# HELP bothy_event_replay_rows_total Ledger rows read by event stream replays (Last-Event-ID, since).",
    "# TYPE bothy_event_replay_rows_total counter",
    `bothy_event_replay_rows_total ${g.replayRows}`,
  ];
}

function relayLines(g: RelayGauges): string[] {
  return [
    "# HELP bothy_relays Open byte relays into sandboxes (tunnel, VNC, port WebSockets): flowing, or paused (the sandbox is not reading).",
    "# TYPE bothy_relays gauge",
    `bothy_relays{state="flowing"} ${g.flowing}`,
    `bothy_relays{state="paused"} ${g.paused}`,
    "# HELP bothy_relay_held_bytes Bytes clients sent into relays that the host holds until the sandbox takes them.",
    "# TYPE bothy_relay_held_bytes gauge",
    `bothy_relay_held_bytes ${g.heldBytes}`,
  ];
}

/** `{a="x",b="y"}` with the format's escapes, or "" for no labels. */
function labelText(labels: Labels): string {
  const parts = Object.entries(labels).map(
    ([k, v]) => `${k}="${v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n")}"`,
  );
  return parts.length ? `{${parts.join(",")}}` : "";
}
