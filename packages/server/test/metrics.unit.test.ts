import { describe, expect, it } from "vitest";
import { Metrics } from "../src/metrics/metrics.ts";

const gauges = { sandboxes: [{ state: "running", driver: "gvisor", n: 2 }], drivers: ["gvisor"] };

/** Every sample line is `name{labels} value` with a numeric value; comments are HELP or TYPE. */
function expectWellFormed(text: string): void {
  expect(text.endsWith("\n")).toBe(true);
  for (const line of text.trimEnd().split("\n")) {
    if (line.startsWith("#")) expect(line).toMatch(/^# (HELP|TYPE) [a-z_]+ .+$/);
    else expect(line).toMatch(/^[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? (-?[0-9.e+-]+|\+Inf)$/);
  }
}

describe("Metrics", () => {
  it("renders gauges with zeros for every state, and counters seeded at zero", () => {
    const text = new Metrics().render(gauges);
    expectWellFormed(text);
    expect(text).toContain('bothy_sandboxes{state="running",driver="gvisor"} 2');
    expect(text).toContain('bothy_sandboxes{state="paused",driver="gvisor"} 0');
    expect(text).toContain("bothy_commands_started_total 0");
    expect(text).toContain('bothy_sweeper_removals_total{reason="orphan"} 0');
    expect(text).toContain("# TYPE bothy_sandbox_create_seconds histogram");
  });

  it("counts lifecycle events and builds a cumulative histogram", () => {
    const m = new Metrics();
    const created = { sandbox_id: "sbx_a", template: "seed", vcpu: 1, memory_mib: 512, driver: "qemu", warm: false };
    m.observe({ event: "sandbox_created", ...created, ms: 3000 });
    m.observe({ event: "sandbox_created", ...created, ms: 200 });
    m.observe({ event: "command_started", sandbox_id: "sbx_a", command_id: "cmd_a", pid: 2, background: false });
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
    const text = m.render(gauges);
    expectWellFormed(text);
    expect(text).toContain('bothy_sandbox_create_seconds_bucket{driver="qemu",warm="false",le="0.25"} 1');
    expect(text).toContain('bothy_sandbox_create_seconds_bucket{driver="qemu",warm="false",le="5"} 2');
    expect(text).toContain('bothy_sandbox_create_seconds_bucket{driver="qemu",warm="false",le="+Inf"} 2');
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

  it("escapes label values", () => {
    const text = new Metrics().render({ sandboxes: [{ state: 'a"b\\c\nd', driver: "x", n: 1 }], drivers: [] });
    expect(text).toContain('bothy_sandboxes{state="a\\"b\\\\c\\nd",driver="x"} 1');
  });
});
