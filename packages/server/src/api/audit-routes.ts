/**
 * `GET /sandboxes/{id}/audit`: the egress gateway's decisions about one sandbox (and its secrets'
 * and approvals' events), from the ledger, oldest first. The sandbox route hook has already
 * answered another tenant's id as unknown.
 */
import type { FastifyInstance } from "fastify";
import { AUDIT_EVENT_TYPES, auditList, auditQuery, BothyError, SANDBOX_ID_RE } from "@bothy/protocol";
import type { EventBus } from "../events/event-bus.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { parseInput } from "./parse-input.ts";
import { json } from "./route-schema.ts";

const auditDoc = {
  tags: ["events"],
  summary:
    "The egress gateway's decisions about this sandbox from the ledger, oldest first (?type=egress.denied, comma-separated; ?after=SEQ pages on; ?limit=)",
  querystring: auditQuery,
  response: { 200: json(auditList, "Events") },
};

export function auditRoutes(app: FastifyInstance, deps: { events: EventBus; ledger: LedgerStore }): void {
  app.get<{ Params: { id: string }; Querystring: Record<string, string> }>(
    "/sandboxes/:id/audit",
    { schema: auditDoc },
    async (request) => {
      const { id } = request.params;
      if (!SANDBOX_ID_RE.test(id) || !(await deps.ledger.getSandbox(id)))
        throw new BothyError("sandbox_not_found", `No sandbox ${id.slice(0, 64)}; list them with GET /sandboxes.`);
      const q = parseInput(
        auditQuery,
        request.query,
        "GET /sandboxes/{id}/audit[?type=egress.denied&after=SEQ&limit=N]",
      );
      const events = await deps.events.ofSandbox(id, q.type ?? AUDIT_EVENT_TYPES, q.after ?? 0, q.limit ?? 100);
      return { events };
    },
  );
}
