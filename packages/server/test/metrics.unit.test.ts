import { describe, expect, it } from "vitest";
import { Metrics } from "../src/metrics/metrics.ts";

const gauges = { sandboxes: [{ state: "running", driver: "gvisor", n: 2 }], drivers: ["gvisor"] };

/** Every sample line is `name{labels} value` with a numeric value; comments are HELP or TYPE. */
function expectWellFormed(text: string): void {
  expect(text.endsWith("\n")).toBe(true);
  // Blank lines between metric families are allowed by the format.
  for (const line of text
    .trimEnd()
    .split("\n")
    .filter((l) => l !== "")) {
    if (line.startsWith("#")) expect(line).toMatch(/^# (HELP|TYPE) [a-z_]+ .+$/);
    else expect(line).toMatch(/^[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? (-?[0-9.e+-]+|\+Inf)$/);
  }
}

describe("Metrics", () => {
  it("renders gauges with zeros for every state, and counters seeded at zero", async () => {
    const text = await new Metrics().render(gauges);
    expectWellFormed(text);
    expect(text).toContain('bothy_sandboxes{state="running",driver="gvisor"} 2');
    expect(text).toContain('bothy_sandboxes{state="paused",driver="gvisor"} 0');
    expect(text).toContain("bothy_commands_started_total 0");
    expect(text).toContain('bothy_sweeper_removals_total{reason="orphan"} 0');
    expect(text).toContain("# TYPE bothy_sandbox_create_seconds histogram");
  });

  it("counts lifecycle events and builds a cumulative histogram", async () => {
    const m = new Metrics();
    const created = { sandbox_id: "sbx_a", template: "seed", vcpu: 1, memory_mib: 512, driver: "qemu", warm: false };
    m.observe({ event: "sandbox_created", ...created, ms: 3000 });
    m.observe({ event: "sandbox_created", ...created, ms: 200 });
    m.observe({
      event: "command_started",
      sandbox_id: "sbx_a",
      command_id: "cmd_a",
      pid: 2,
      background: false,
      ms: 30,
    });
    m.observe({
      event: "command_exited",
      sandbox_id: "sbx_a",
      command_id: "cmd_a",
      exit_code: 0,
      signal: null,
      timed_out: false,
    });
    m.observe({ event: "orphan_removed", sandbox_id: "x", kind: "vm", description: "", by: "sweeper" });
    m.observe({ event: "sandbox_deleted", sandbox_id: "sbx_a", reason: "expired" });
    m.observe({ event: "sandbox_died", sandbox_id: "sbx_b", detected_by: "sweeper" });
    m.observe({ event: "sandbox_paused", sandbox_id: "sbx_b" });
    m.error("invalid_request");
    m.error("invalid_request");
    const text = await m.render(gauges);
    expectWellFormed(text);
    expect(text).toContain('bothy_sandbox_create_seconds_bucket{le="0.25",driver="qemu",warm="false"} 1');
    expect(text).toContain('bothy_sandbox_create_seconds_bucket{le="5",driver="qemu",warm="false"} 2');
    expect(text).toContain('bothy_sandbox_create_seconds_bucket{le="+Inf",driver="qemu",warm="false"} 2');
    expect(text).toContain('bothy_sandbox_create_seconds_sum{driver="qemu",warm="false"} 3.2');
    expect(text).toContain('bothy_sandbox_create_seconds_count{driver="qemu",warm="false"} 2');
    expect(text).toContain("bothy_commands_started_total 1");
    expect(text).toContain("bothy_commands_exited_total 1");
    expect(text).toContain('bothy_errors_total{code="invalid_request"} 2');
    expect(text).toContain('bothy_sweeper_removals_total{reason="orphan"} 1');
    expect(text).toContain('bothy_sweeper_removals_total{reason="expired"} 1');
    expect(text).toContain('bothy_sweeper_removals_total{reason="dead"} 1');
    expect(text).toContain('bothy_sandboxes_deleted_total{reason="expired"} 1');
  });

  it("escapes label values", async () => {
    const text = await new Metrics().render({ sandboxes: [{ state: 'a"b\\c\nd', driver: "x", n: 1 }], drivers: [] });
    expect(text).toContain('bothy_sandboxes{state="a\\"b\\\\c\\nd",driver="x"} 1');
  });

  it("times commands and the egress gateway's decisions in histograms", async () => {
    const m = new Metrics();
    const started = { sandbox_id: "sbx_a", command_id: "cmd_a", pid: 2, background: false };
    m.observe({ event: "command_started", ...started, ms: 20 });
    m.observe({ event: "command_started", ...started, ms: 400 });
    const decision = { sandbox_id: "sbx_a", host: "example.com", method: "GET", path: "/", rule: "default" };
    m.observe({ event: "egress_allowed", ...decision, action: "allow", outcome: "allowed", ms: 3 });
    m.observe({ event: "egress_denied", ...decision, action: "deny", outcome: "denied", ms: 2 });
    // A refusal before any request was read has no time, and no sample.
    m.observe({ event: "egress_denied", ...decision, rule: "sni", action: "deny", outcome: "refused" });
    const text = await m.render(gauges);
    expectWellFormed(text);
    expect(text).toContain("# TYPE bothy_command_start_seconds histogram");
    expect(text).toContain('bothy_command_start_seconds_bucket{le="0.025"} 1');
    expect(text).toContain('bothy_command_start_seconds_bucket{le="0.5"} 2');
    expect(text).toContain("bothy_command_start_seconds_count 2");
    expect(text).toContain('bothy_egress_decision_seconds_bucket{le="0.005",decision="allowed"} 1');
    expect(text).toContain('bothy_egress_decision_seconds_count{decision="allowed"} 1');
    expect(text).toContain('bothy_egress_decision_seconds_count{decision="denied"} 1');
  });

  it("keeps each server's metrics to itself", async () => {
    const a = new Metrics();
    const b = new Metrics();
    a.error("invalid_request");
    expect(await a.render(gauges)).toContain('bothy_errors_total{code="invalid_request"} 1');
    expect(await b.render(gauges)).not.toContain("invalid_request");
  });
});
