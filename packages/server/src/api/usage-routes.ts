import type { FastifyInstance } from "fastify";
import { BothyError, SANDBOX_ID_RE, sandboxUsageList, usageDays, usageDaysQuery, usageReport } from "@bothy/protocol";
import { z } from "zod";
import { principalOf, sandboxNotFound, sees } from "../auth/auth-hooks.ts";
import type { LedgerStore } from "../ledger/store.ts";
import type { UsageMeter } from "../metering/usage-meter.ts";
import { parseInput } from "./parse-input.ts";
import { json } from "./route-schema.ts";

const usageDoc = {
  tags: ["server"],
  summary:
    "Metered vCPU and memory hours this month, per owner, with the budgets (?sandbox_id= adds one sandbox's lifetime figures)",
  querystring: z.object({ sandbox_id: z.string().optional() }),
  response: { 200: json(usageReport, "Usage") },
};

const daysDoc = {
  tags: ["server"],
  summary:
    "Metered vCPU and memory hours per owner and UTC day over the last `days` days (default 31), the caller's tenant only unless it holds admin",
  querystring: usageDaysQuery,
  response: { 200: json(usageDays, "Usage per day") },
};

const sandboxesDoc = {
  tags: ["server"],
  summary:
    "Metered vCPU-seconds and GiB-seconds of memory of each live sandbox of the caller's tenant (every tenant's with admin), in one answer; a sandbox that has metered nothing yet is not listed",
  response: { 200: json(sandboxUsageList, "Usage per sandbox") },
};

/**
 * `GET /usage`: this month's metered hours per tenant (`owner`) and the budgets, the caller's
 * tenant only unless it holds `admin`; `?sandbox_id=` adds one sandbox. `GET /usage/days`: the
 * same per UTC day, for a chart of the month against its budget. `GET /usage/sandboxes`:
 * every live sandbox's figures at once, so a list of them needs one call, not one per row.
 */
export function usageRoutes(app: FastifyInstance, meter: UsageMeter, ledger: LedgerStore): void {
  app.get<{ Querystring: { sandbox_id?: string } }>("/usage", { schema: usageDoc }, async (request) => {
    const principal = principalOf(request);
    await meter.tick();
    const all = await meter.report();
    const report = { ...all, owners: all.owners.filter((o) => sees(principal, o.owner)) };
    const id = request.query.sandbox_id;
    if (id === undefined) return report;
    if (!SANDBOX_ID_RE.test(id))
      throw new BothyError("sandbox_not_found", `No sandbox ${id.slice(0, 64)}; list them with GET /sandboxes.`);
    const row = await ledger.getSandbox(id);
    if (!row || !sees(principal, row.tenant)) throw sandboxNotFound(id);
    const u = (await ledger.sandboxUsage(id)) ?? { vcpu_seconds: 0, gib_seconds: 0 };
    return {
      ...report,
      sandbox: { sandbox_id: id, vcpu_hours: u.vcpu_seconds / 3600, gib_hours: u.gib_seconds / 3600 },
    };
  });

  app.get("/usage/days", { schema: daysDoc }, async (request) => {
    const principal = principalOf(request);
    const { days } = parseInput(usageDaysQuery, request.query, "GET /usage/days");
    await meter.tick();
    const all = await meter.days(days);
    return { ...all, days: all.days.filter((d) => sees(principal, d.owner)) };
  });

  app.get("/usage/sandboxes", { schema: sandboxesDoc }, async (request) => {
    const principal = principalOf(request);
    await meter.tick();
    const tenant = principal.scopes.has("admin") ? undefined : principal.tenant;
    return { sandboxes: await ledger.liveSandboxUsage(tenant) };
  });
}
