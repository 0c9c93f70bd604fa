/** What commands print: JSON for `--json`, aligned tables and key/value blocks for people. */
import type { SandboxInfo } from "@bothy/sdk";

export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
}

export function printTable(header: string[], rows: string[][]): void {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  for (const row of [header, ...rows]) {
    process.stdout.write(
      `${row.map((cell, i) => (i === row.length - 1 ? cell : cell.padEnd(widths[i] ?? 0))).join("  ")}\n`,
    );
  }
}

/** A list: `{ [name]: items }` for --json, else a table of `header` and a row per item. */
export function printList<T>(
  json: boolean | undefined,
  name: string,
  items: T[],
  header: string[],
  row: (item: T) => string[],
): void {
  if (json) printJson({ [name]: items });
  else printTable(header, items.map(row));
}

/** "3m ago", "in 58m": times relative to now, for tables. */
export function relative(iso: string | null | undefined, now = Date.now()): string {
  if (!iso) return "-";
  const s = Math.round((Date.parse(iso) - now) / 1000);
  const abs = Math.abs(s);
  const text =
    abs < 60
      ? `${abs}s`
      : abs < 3600
        ? `${Math.round(abs / 60)}m`
        : abs < 86400
          ? `${Math.round(abs / 3600)}h`
          : `${Math.round(abs / 86400)}d`;
  return s < 0 ? `${text} ago` : `in ${text}`;
}

export function sandboxRow(s: SandboxInfo): string[] {
  return [
    s.sandbox_id,
    s.state,
    s.template,
    s.driver,
    String(s.vcpu),
    `${s.memory_mib}M`,
    relative(s.created_at),
    relative(s.expires_at),
  ];
}
export const SANDBOX_HEADER = ["ID", "STATE", "TEMPLATE", "DRIVER", "VCPU", "MEMORY", "CREATED", "EXPIRES"];

export function printSandbox(s: SandboxInfo): void {
  const rows: Array<[string, string]> = [
    ["id", s.sandbox_id],
    ["state", s.state],
    ["template", s.template],
    ["driver", `${s.driver}${s.acceleration ? ` (${s.acceleration})` : ""}`],
    ["vcpu", String(s.vcpu)],
    ["memory", `${s.memory_mib} MiB`],
    ...(s.disk_mib == null ? [] : [["disk", `${s.disk_mib} MiB`] as [string, string]]),
    ...(s.max_processes == null ? [] : [["processes", `at most ${s.max_processes}`] as [string, string]]),
    ["created", `${s.created_at} (${relative(s.created_at)})`],
    ["expires", s.expires_at ? `${s.expires_at} (${relative(s.expires_at)})` : "-"],
  ];
  if (s.deleted_at) rows.push(["deleted", s.deleted_at]);
  if (s.delete_on_disconnect) rows.push(["delete on disconnect", "yes"]);
  if (s.error) rows.push(["error", s.error]);
  const width = Math.max(...rows.map(([k]) => k.length));
  for (const [k, v] of rows) process.stdout.write(`${`${k}:`.padEnd(width + 2)}${v}\n`);
}
