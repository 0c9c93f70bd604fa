/**
 * Reads the Prometheus text format (version 0.0.4) as GET /metrics serves it: each sample's name,
 * labels and value; `# HELP`, `# TYPE` and blank lines are skipped. Enough for the figures the
 * metrics page shows, not a general exposition parser (no timestamps kept, no exemplars).
 */
export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*/g;

function unescape(v: string): string {
  return v.replace(/\\(.)/g, (_, c: string) => (c === "n" ? "\n" : c));
}

function number(s: string): number {
  if (s === "+Inf") return Infinity;
  if (s === "-Inf") return -Infinity;
  return Number(s);
}

export function parsePrometheus(text: string): Sample[] {
  const out: Sample[] = [];
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) continue;
    const m = SAMPLE.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? "").matchAll(LABEL)) labels[l[1]!] = unescape(l[2]!);
    out.push({ name: m[1]!, labels, value: number(m[3]!) });
  }
  return out;
}

/** The sum of a metric's samples whose labels include `where`. */
export function total(samples: readonly Sample[], name: string, where: Record<string, string> = {}): number {
  let sum = 0;
  for (const s of samples)
    if (s.name === name && Object.entries(where).every(([k, v]) => s.labels[k] === v)) sum += s.value;
  return sum;
}

/** A metric's sums by one label's value (`bothy_sandboxes` by `state`), zeros left out. */
export function byLabel(samples: readonly Sample[], name: string, label: string): Array<[string, number]> {
  const sums = new Map<string, number>();
  for (const s of samples)
    if (s.name === name) sums.set(s.labels[label] ?? "", (sums.get(s.labels[label] ?? "") ?? 0) + s.value);
  return [...sums].filter(([, n]) => n !== 0);
}

/**
 * A histogram's quantile `q` (0.5 for the median), estimated as Prometheus's histogram_quantile
 * does: linear within the bucket it falls in. Buckets of every label set are added together;
 * null when nothing was observed.
 */
export function quantile(samples: readonly Sample[], name: string, q: number): number | null {
  const buckets = new Map<number, number>();
  for (const s of samples) {
    if (s.name !== `${name}_bucket`) continue;
    const le = number(s.labels["le"] ?? "NaN");
    buckets.set(le, (buckets.get(le) ?? 0) + s.value);
  }
  const sorted = [...buckets].sort((a, b) => a[0] - b[0]);
  const count = sorted.at(-1)?.[1] ?? 0;
  if (count === 0) return null;
  const rank = q * count;
  let prevLe = 0;
  let prevCount = 0;
  for (const [le, c] of sorted) {
    if (c >= rank) {
      // In the +Inf bucket the best estimate is the highest finite bound.
      if (le === Infinity) return prevLe;
      return prevLe + ((le - prevLe) * (rank - prevCount)) / Math.max(c - prevCount, 1e-9);
    }
    prevLe = le;
    prevCount = c;
  }
  return prevLe;
}
