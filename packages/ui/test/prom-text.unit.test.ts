import { describe, expect, it } from "vitest";
import { byLabel, parsePrometheus, quantile, total } from "../src/prom-text.ts";

const TEXT = `# HELP bothy_sandboxes Sandboxes in the ledger, by state and driver.
# TYPE bothy_sandboxes gauge
bothy_sandboxes{state="running",driver="gvisor"} 3
bothy_sandboxes{state="running",driver="qemu"} 1
bothy_sandboxes{state="paused",driver="qemu"} 0
bothy_errors_total{code="quota_exceeded"} 2
bothy_errors_total{code="odd \\"code\\", with\\\\comma"} 1
bothy_create_seconds_bucket{driver="gvisor",le="0.5"} 2
bothy_create_seconds_bucket{driver="gvisor",le="1"} 4
bothy_create_seconds_bucket{driver="gvisor",le="+Inf"} 4
bothy_create_seconds_bucket{driver="qemu",le="0.5"} 0
bothy_create_seconds_bucket{driver="qemu",le="1"} 0
bothy_create_seconds_bucket{driver="qemu",le="+Inf"} 4
process_start_time_seconds 1764720000 1764720000123
`;

describe("the metrics page's Prometheus text reader", () => {
  const samples = parsePrometheus(TEXT);

  it("reads names, labels with escapes, values and skips comments and timestamps", () => {
    expect(samples).toHaveLength(12);
    expect(samples[4]?.labels).toEqual({ code: 'odd "code", with\\comma' });
    expect(samples.at(-1)).toEqual({ name: "process_start_time_seconds", labels: {}, value: 1764720000 });
  });

  it("sums by label and in total, leaving zeros out of the breakdown", () => {
    expect(total(samples, "bothy_sandboxes")).toBe(4);
    expect(total(samples, "bothy_sandboxes", { driver: "qemu" })).toBe(1);
    expect(byLabel(samples, "bothy_sandboxes", "state")).toEqual([["running", 4]]);
  });

  it("estimates a histogram's quantiles over every label set as histogram_quantile does", () => {
    // 8 observations: 2 under 0.5, 2 more under 1, 4 above the last finite bound.
    expect(quantile(samples, "bothy_create_seconds", 0.25)).toBe(0.5);
    expect(quantile(samples, "bothy_create_seconds", 0.375)).toBe(0.75);
    expect(quantile(samples, "bothy_create_seconds", 0.9)).toBe(1);
    expect(quantile(samples, "nothing_here", 0.5)).toBeNull();
  });
});
