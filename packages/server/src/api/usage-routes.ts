import type { FastifyInstance } from "fastify";
import { BothyError, SANDBOX_ID_RE } from "@bothy/protocol";
import type { Ledger } from "../ledger/ledger.ts";
import type { UsageMeter } from "../metering/usage-meter.ts";

/** `GET /usage`: this month's metered hours per owner and the budgets; `?sandbox_id=` adds one sandbox. */
export function usageRoutes(app: FastifyInstance, meter: UsageMeter, ledger: Ledger): void {
  app.get<{ Querystring: { sandbox_id?: string } }>("/usage", async (request) => {
    meter.tick();
    const report = meter.report();
    const id = request.query.sandbox_id;
    if (id === undefined) return report;
    if (!SANDBOX_ID_RE.test(id) || !ledger.getSandbox(id))
      throw new BothyError("sandbox_not_found", `No sandbox ${id.slice(0, 64)}; list them with GET /sandboxes.`);
    const u = ledger.sandboxUsage(id) ?? { vcpu_seconds: 0, gib_seconds: 0 };
    return {
      ...report,
      sandbox: { sandbox_id: id, vcpu_hours: u.vcpu_seconds / 3600, gib_hours: u.gib_seconds / 3600 },
    };
  });
}
