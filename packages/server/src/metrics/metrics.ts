import { Counter, Gauge, Histogram, Registry } from "prom-client";
import { SANDBOX_STATES } from "@bothy/protocol";
import type { PortRoute } from "../api/port-dialer.ts";
import type { RelayGauges } from "../api/relay-meter.ts";
import type { EventStreamGauges } from "../events/event-streams.ts";
import type { ServerEvent } from "../events/server-events.ts";

/**
 * The server's Prometheus metrics, on a prom-client registry of its own (not the library's global
 * one: a process may run several servers, as the tests do). Lifecycle numbers come from the
 * typed server events (`observe`), so no part of the server needs to know about metrics; gauges
 * are read at scrape time.
 */

/** Create and wake latency buckets in seconds: gVisor warm starts are well under 1 s, cold QEMU under TCG ~5-10 s. */
const START_BUCKETS = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
/** A command's spawn round trip: ~30 ms on gVisor (native spawn ~12 ms), far more under QEMU's emulation. */
const COMMAND_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];
/** The gateway's own time per decision: a policy look-up and a DNS answer, or a person's approval. */
const EGRESS_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 300];

/** What the gauges show, read at scrape time. */
export interface Gauges {
  sandboxes: Array<{ state: string; driver: string; n: number }>;
  /** Drivers that get a series for every state, 0 when empty, so dashboards see them from the start. */
  drivers: string[];
  /** Open `GET /events` streams and what their replays read. */
  eventStreams?: EventStreamGauges;
  /** Open byte relays into sandboxes (tunnel, VNC, port WebSockets). */
  relays?: RelayGauges;
  /** Port connections opened so far (port-dialer.ts), by the route they took. */
  portRoutes?: Record<PortRoute, number>;
  /** Sockets the port proxy keeps to sandboxes' ports (port-pool.ts), idle and busy. */
  portPoolSockets?: number;
}

export class Metrics {
  readonly registry = new Registry();
  private readonly registers = [this.registry];

  private readonly sandboxes = this.gauge("bothy_sandboxes", "Sandboxes in the ledger, by state and driver.", [
    "state",
    "driver",
  ]);
  private readonly createSeconds = new Histogram({
    name: "bothy_sandbox_create_seconds",
    help: "Time from create request to a running sandbox, by driver and whether the warm pool served it.",
    labelNames: ["driver", "warm"],
    buckets: START_BUCKETS,
    registers: this.registers,
  });
  private readonly wakeSeconds = new Histogram({
    name: "bothy_sandbox_wake_seconds",
    help: "Time to start a paused or stopped sandbox again on the next call, by driver and the state it woke from.",
    labelNames: ["driver", "from"],
    buckets: START_BUCKETS,
    registers: this.registers,
  });
  private readonly commandSeconds = new Histogram({
    name: "bothy_command_start_seconds",
    help: "Time from asking a sandbox's agent for a command to its process running there.",
    buckets: COMMAND_BUCKETS,
    registers: this.registers,
  });
  private readonly egressSeconds = new Histogram({
    name: "bothy_egress_decision_seconds",
    help: "The egress gateway's time from a sandbox's request to its decision, by decision (allowed, denied, asked).",
    labelNames: ["decision"],
    buckets: EGRESS_BUCKETS,
    registers: this.registers,
  });
  private readonly creates = this.counter("bothy_sandboxes_created_total", "Sandboxes created, by driver.", ["driver"]);
  private readonly createFailures = this.counter("bothy_sandbox_create_failures_total", "Creates that failed to boot.");
  private readonly deletions = this.counter(
    "bothy_sandboxes_deleted_total",
    "Sandboxes deleted, by reason: requested, expired (the sweeper), disconnected (client gone).",
    ["reason"],
    ["requested", "expired", "disconnected"],
  );
  private readonly deaths = this.counter(
    "bothy_sandbox_deaths_total",
    "Sandboxes that stopped on their own, by who noticed: the driver or the sweeper.",
    ["detected_by"],
    ["driver", "sweeper"],
  );
  private readonly commandsStarted = this.counter("bothy_commands_started_total", "Commands started in sandboxes.");
  private readonly commandsExited = this.counter(
    "bothy_commands_exited_total",
    "Commands that exited (including killed and timed out).",
  );
  private readonly commandsLost = this.counter(
    "bothy_commands_lost_total",
    "Commands whose sandbox or agent went away before they exited.",
  );
  private readonly errors = this.counter("bothy_errors_total", "Error responses, by error code.", ["code"]);
  private readonly sweeper = this.counter(
    "bothy_sweeper_removals_total",
    "What the sweeper and start-up reconcile removed: expired sandboxes, dead sandboxes, lost ledger rows, orphan host objects.",
    ["reason"],
    ["expired", "dead", "lost", "orphan"],
  );
  private readonly disconnects = this.counter(
    "bothy_disconnect_grace_started_total",
    "Times the last client socket of a delete_on_disconnect sandbox dropped and its grace period began.",
  );
  private readonly eventStreams = this.gauge(
    "bothy_event_streams",
    "Open GET /events streams: live, replaying (paging through the ledger), or behind (waiting for a client that stopped reading).",
    ["state"],
  );
  private readonly eventBuffered = this.gauge(
    "bothy_event_stream_buffered_bytes",
    "Bytes written to event streams that their clients have not taken yet.",
  );
  // The streams keep the running total; it is read at scrape time.
  private readonly replayRows = this.counter(
    "bothy_event_replay_rows_total",
    "LedgerStore rows read by event stream replays (Last-Event-ID, since).",
  );
  private readonly relays = this.gauge(
    "bothy_relays",
    "Open byte relays into sandboxes (tunnel, VNC, port WebSockets): flowing, or paused (the sandbox is not reading).",
    ["state"],
  );
  private readonly relayHeld = this.gauge(
    "bothy_relay_held_bytes",
    "Bytes clients sent into relays that the host holds until the sandbox takes them.",
  );

  private readonly portConnections = this.counter(
    "bothy_port_connections_total",
    "Connections to ports inside sandboxes (port URLs, tunnels): direct to the sandbox's address, or over the guest channel because it has no network, its server refused the address (listens on 127.0.0.1 only) or the address did not answer.",
    ["path", "why"],
  );
  private readonly portPool = this.gauge(
    "bothy_port_pool_sockets",
    "Kept-alive connections from the port proxy to sandboxes' ports (idle and busy); each sandbox's close with it.",
  );

  /** A counter; `seed`: values of its one label shown as 0 before anything is counted. */
  private gauge(name: string, help: string, labelNames: string[] = []): Gauge {
    return new Gauge({ name, help, labelNames, registers: this.registers });
  }

  private counter(name: string, help: string, labelNames: string[] = [], seed: string[] = []): Counter {
    const c = new Counter({ name, help, labelNames, registers: this.registers });
    const label = labelNames[0];
    if (label !== undefined) for (const value of seed) c.inc({ [label]: value }, 0);
    return c;
  }

  /** Takes every server event; the ones that count are counted. */
  observe(ev: ServerEvent): void {
    switch (ev.event) {
      case "sandbox_created":
        this.creates.inc({ driver: ev.driver });
        this.createSeconds.observe({ driver: ev.driver, warm: String(ev.warm) }, ev.ms / 1000);
        break;
      case "sandbox_woken":
        this.wakeSeconds.observe({ driver: ev.driver, from: ev.from }, ev.ms / 1000);
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
        this.commandSeconds.observe(ev.ms / 1000);
        break;
      case "command_exited":
        this.commandsExited.inc();
        break;
      case "command_lost":
        this.commandsLost.inc();
        break;
      case "egress_allowed":
      case "egress_denied":
      case "egress_asked":
        // Refusals found before a request was read (a bad SNI, a placeholder) carry no time.
        if (ev.ms !== undefined)
          this.egressSeconds.observe({ decision: ev.event.slice("egress_".length) }, ev.ms / 1000);
        break;
    }
  }

  error(code: string): void {
    this.errors.inc({ code });
  }

  /** The whole exposition in Prometheus' text format, the gauges set from `gauges` first. */
  async render(gauges: Gauges): Promise<string> {
    this.sandboxes.reset();
    for (const driver of gauges.drivers) for (const state of SANDBOX_STATES) this.sandboxes.set({ state, driver }, 0);
    for (const c of gauges.sandboxes) this.sandboxes.set({ state: c.state, driver: c.driver }, c.n);
    const e = gauges.eventStreams;
    if (e) {
      for (const state of ["live", "replaying", "behind"] as const) this.eventStreams.set({ state }, e[state]);
      this.eventBuffered.set(e.bufferedBytes);
      this.replayRows.reset();
      this.replayRows.inc(e.replayRows);
    }
    const r = gauges.relays;
    if (r) {
      for (const state of ["flowing", "paused"] as const) this.relays.set({ state }, r[state]);
      this.relayHeld.set(r.heldBytes);
    }
    if (gauges.portRoutes) {
      this.portConnections.reset();
      for (const [route, n] of Object.entries(gauges.portRoutes))
        this.portConnections.inc(route === "direct" ? { path: "direct" } : { path: "channel", why: route }, n);
    }
    if (gauges.portPoolSockets !== undefined) this.portPool.set(gauges.portPoolSockets);
    return this.registry.metrics();
  }

  /** The media type of `render`'s text. */
  get contentType(): string {
    return this.registry.contentType;
  }
}
