/**
 * `/metrics` as Prometheus scrapes it, from a real server: the latency histograms move when a
 * sandbox is created and a command runs. (Egress decisions need a network lab; their histogram
 * is covered in metrics.unit.test.ts, and the gateway's events in egress.test.ts.)
 */
import { describe, expect, it } from "vitest";
import { api, createSandbox } from "./helpers/client.ts";
import { useTestServer } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** The samples of the text exposition format (HELP/TYPE comments and blank lines skipped). */
function parse(text: string): Sample[] {
  const samples: Sample[] = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`not a sample line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? "").matchAll(/([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1] ?? ""] = l[2] ?? "";
    samples.push({ name: m[1] ?? "", labels, value: Number(m[3]) });
  }
  return samples;
}

async function scrape(ts: TestServer): Promise<Sample[]> {
  const res = await fetch(`${ts.url}/metrics`);
  expect(res.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);
  return parse(await res.text());
}

/** The sum of a series' values over the label sets that match `where`. */
function total(samples: Sample[], name: string, where: Record<string, string> = {}): number {
  return samples
    .filter((s) => s.name === name && Object.entries(where).every(([k, v]) => s.labels[k] === v))
    .reduce((sum, s) => sum + s.value, 0);
}

describe("GET /metrics (prom-client)", () => {
  let ts: TestServer;
  useTestServer({ BOTHY_DRIVER: "gvisor" }, (s) => (ts = s));

  it("moves the create and command histograms, with cumulative buckets", async () => {
    const before = await scrape(ts);
    expect(total(before, "bothy_command_start_seconds_count")).toBe(0);

    const id = await createSandbox(ts.url);
    const created = await scrape(ts);
    const gvisor = { driver: "gvisor" };
    expect(total(created, "bothy_sandbox_create_seconds_count", gvisor)).toBe(
      total(before, "bothy_sandbox_create_seconds_count", gvisor) + 1,
    );
    expect(total(created, "bothy_sandbox_create_seconds_sum", gvisor)).toBeGreaterThan(0);
    expect(total(created, "bothy_sandboxes_created_total", gvisor)).toBeGreaterThan(0);

    const ran = await api(ts.url, "POST", `/sandboxes/${id}/commands`, { cmd: "true" });
    expect(ran.status).toBe(200);
    const after = await scrape(ts);
    expect(total(after, "bothy_command_start_seconds_count")).toBe(1);
    expect(total(after, "bothy_commands_started_total")).toBe(1);
    expect(total(after, "bothy_command_start_seconds_sum")).toBeGreaterThan(0);
    // Buckets are cumulative and end with +Inf, which counts every sample.
    const buckets = after.filter((s) => s.name === "bothy_command_start_seconds_bucket");
    const counts = buckets.map((b) => b.value);
    expect(counts).toEqual([...counts].sort((a, b) => a - b));
    expect(buckets.at(-1)).toMatchObject({ labels: { le: "+Inf" }, value: 1 });
    // A labelled histogram has no series before its first sample (nothing woke or went out here).
    expect(after.some((s) => s.name.startsWith("bothy_egress_decision_seconds"))).toBe(false);
    expect(after.some((s) => s.name === "bothy_sandbox_wake_seconds_count")).toBe(false);
    await api(ts.url, "DELETE", `/sandboxes/${id}?wait=true`);
  });
});
