import { BothyError } from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";

/** One of E2B's metric samples, in its wire shape. */
export interface E2bMetric {
  timestamp: string;
  timestampUnix: number;
  cpuUsedPct: number;
  cpuCount: number;
  memUsed: number;
  memTotal: number;
  memCache: number;
  diskUsed: number;
  diskTotal: number;
}

/** CPU counters twice, a short while apart (for a usage ratio), then memory and the root disk. */
const PROBE = "head -1 /proc/stat; sleep 0.25; head -1 /proc/stat; cat /proc/meminfo; df -kP / | tail -1";
const PROBE_TIMEOUT_MS = 15_000;

function run(agent: AgentClient, cmd: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(
      () =>
        reject(new BothyError("agent_unavailable", `Reading the sandbox's metrics took over ${PROBE_TIMEOUT_MS} ms.`)),
      PROBE_TIMEOUT_MS,
    );
    agent.exec(
      { cmd, cwd: "/" },
      {
        onStarted: () => undefined,
        onOutput: (fd, data, consumed) => {
          if (fd === 1) out += data.toString("utf8");
          consumed();
        },
        onExited: () => {
          clearTimeout(timer);
          resolve(out);
        },
        onError: (err) => {
          clearTimeout(timer);
          reject(err);
        },
      },
    );
  });
}

/** Busy and total jiffies of a `/proc/stat` "cpu" line. */
function cpuTimes(line: string | undefined): { busy: number; total: number } {
  const fields = (line ?? "").trim().split(/\s+/).slice(1).map(Number);
  const total = fields.slice(0, 8).reduce((a, b) => a + (Number.isFinite(b) ? b : 0), 0);
  const idle = (fields[3] ?? 0) + (fields[4] ?? 0);
  return { busy: total - idle, total };
}

/** Parses the probe's output (exported for unit tests). */
export function parseProbe(output: string, cpuCount: number, now: Date): E2bMetric {
  const lines = output.split("\n");
  const cpuLines = lines.filter((l) => l.startsWith("cpu "));
  const a = cpuTimes(cpuLines[0]);
  const b = cpuTimes(cpuLines[1]);
  const span = b.total - a.total;
  const kb = (name: string): number => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, "m").exec(output)?.[1] ?? 0) * 1024;
  const memTotal = kb("MemTotal");
  const available = kb("MemAvailable") || kb("MemFree");
  const df = (lines.findLast((l) => /^\S+\s+\d+\s+\d+\s+\d+/.test(l)) ?? "").trim().split(/\s+/);
  return {
    timestamp: now.toISOString(),
    timestampUnix: Math.floor(now.getTime() / 1000),
    cpuUsedPct: span > 0 ? Math.round(((b.busy - a.busy) / span) * 10000) / 100 : 0,
    cpuCount,
    memUsed: Math.max(memTotal - available, 0),
    memTotal,
    memCache: kb("Cached"),
    diskUsed: Number(df[2] ?? 0) * 1024,
    diskTotal: Number(df[1] ?? 0) * 1024,
  };
}

/**
 * A sample of the sandbox taken now, from inside it. bothy keeps no metrics history, so E2B's
 * time series is this one point (when it falls within the asked range).
 */
export async function sampleMetrics(agent: AgentClient, cpuCount: number): Promise<E2bMetric> {
  return parseProbe(await run(agent, PROBE), cpuCount, new Date());
}
