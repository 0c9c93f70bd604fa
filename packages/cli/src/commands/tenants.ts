import { Tenants, type TenantInfo, type TenantQuota } from "@bothy/sdk";
import { connection, JSON_FLAG, UsageError } from "../args/parse.ts";
import { subcommandsCommand } from "../command.ts";
import { printJson, printTable } from "../output.ts";

const QUOTAS = [
  "max_sandboxes",
  "max_vcpu",
  "max_memory_mib",
  "creates_per_minute",
  "monthly_vcpu_hours",
  "monthly_gib_hours",
  "max_storage_mib",
] as const;

const USAGE = `usage: bothy tenants create ID [NAME=VALUE]... [--json]
       bothy tenants ls [--json]
       bothy tenants quota ID NAME=VALUE... [--json]
       bothy tenants rm ID

Tenants and their quotas (scope admin). Quotas: ${QUOTAS.join(", ")};
a value of "none" lifts one. Over a quota, creates are refused with 429 quota_exceeded.
A tenant is removed only once it holds nothing (no live sandbox, unrevoked key, secret,
volume or snapshot); its name is not given again.
`;

function quotaArgs(pairs: string[]): TenantQuota {
  const quota: Record<string, number | null> = {};
  for (const pair of pairs) {
    const [name, value] = pair.split("=");
    if (!name || value === undefined || !(QUOTAS as readonly string[]).includes(name))
      throw new UsageError(`"${pair}" is not NAME=VALUE with NAME one of ${QUOTAS.join(", ")}`);
    const n = value === "none" ? null : Number(value);
    if (n !== null && !(n > 0)) throw new UsageError(`${name} takes a positive number or none`);
    quota[name] = n;
  }
  return quota as TenantQuota;
}

function print(tenants: TenantInfo[]): void {
  printTable(
    ["TENANT", "SANDBOXES", "VCPU", "MEMORY MIB", "QUOTA"],
    tenants.map((t) => [
      t.tenant,
      String(t.live.sandboxes),
      String(t.live.vcpu),
      String(t.live.memory_mib),
      Object.entries(t.quota)
        .map(([k, v]) => `${k}=${String(v)}`)
        .join(" ") || "-",
    ]),
  );
}

export const tenantsCommand = subcommandsCommand({
  name: "tenants",
  summary: "create, list and remove tenants, set their quotas",
  usage: USAGE,
  options: JSON_FLAG,
  positionals: { min: 0, max: Infinity, names: "tenant id" },
  async run(sub, { values, positionals }) {
    const conn = connection(values);
    const [id, ...pairs] = positionals;
    let shown: TenantInfo[];
    if (sub === "rm") {
      if (id === undefined || pairs.length > 0) throw new UsageError("name one tenant id");
      const { deleted } = await Tenants.delete(id, conn);
      if (values.json) printJson({ deleted });
      else process.stdout.write(`${deleted}\n`);
      return 0;
    }
    if (sub === "ls" || sub === "list") shown = await Tenants.list(conn);
    else if (sub === "create" || sub === "quota") {
      if (id === undefined) throw new UsageError("missing tenant id");
      if (sub === "quota" && pairs.length === 0) throw new UsageError("name at least one NAME=VALUE");
      shown = [
        sub === "create"
          ? await Tenants.create(id, quotaArgs(pairs), conn)
          : await Tenants.setQuota(id, quotaArgs(pairs), conn),
      ];
    } else throw new UsageError(`unknown subcommand ${sub}`);
    if (values.json) printJson(sub === "ls" || sub === "list" ? { tenants: shown } : shown[0]);
    else print(shown);
    return 0;
  },
});
