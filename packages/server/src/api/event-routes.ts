import type { FastifyInstance } from "fastify";
import { BothyError, SANDBOX_ID_RE } from "@bothy/protocol";
import { principalOf } from "../auth/auth-hooks.ts";
import type { EventBus } from "../events/event-bus.ts";
import { EventStream } from "../events/event-stream.ts";
import type { EventStreams } from "../events/event-streams.ts";
import { z } from "zod";
import { media } from "./route-schema.ts";

const eventsDoc = {
  tags: ["events"],
  summary: "Server-Sent Events (?sandbox_id= filters; Last-Event-ID or ?since= replays)",
  querystring: z.object({ sandbox_id: z.string().optional(), since: z.string().regex(/^\d+$/).optional() }),
  response: { 200: media("text/event-stream", "An SSE stream; each data line is an Event") },
};

/**
 * `GET /events`: Server-Sent Events. `?sandbox_id=` filters; `Last-Event-ID` (or `?since=`)
 * replays what was missed from the ledger before live events follow. A key sees its tenant's
 * events only (an admin key every event, host-wide ones included). The stream never holds more
 * than a socket buffer and a page for a client that stops reading (events/event-stream.ts).
 */
export function eventRoutes(app: FastifyInstance, bus: EventBus, streams: EventStreams): void {
  app.get<{ Querystring: { sandbox_id?: string; since?: string } }>(
    "/events",
    { schema: eventsDoc },
    async (request, reply) => {
      const { sandbox_id: sandboxId, since } = request.query;
      if (sandboxId !== undefined && !SANDBOX_ID_RE.test(sandboxId))
        throw new BothyError("invalid_sandbox_id", "sandbox_id must be a sandbox id (sbx_ and 20 letters and digits).");
      const lastId = request.headers["last-event-id"] ?? since;
      const from = lastId === undefined ? undefined : Number(lastId);
      if (from !== undefined && (!Number.isInteger(from) || from < 0))
        throw new BothyError("invalid_request", "Last-Event-ID and since are event sequence numbers (integers >= 0).");

      const principal = principalOf(request);
      const scope = {
        tenant: principal.scopes.has("admin") ? null : principal.tenant,
        ...(sandboxId === undefined ? {} : { sandboxId }),
      };
      reply.hijack();
      const res = reply.raw;
      res.writeHead(200, {
        "content-type": "text/event-stream",
        "cache-control": "no-cache",
        connection: "keep-alive",
        "x-accel-buffering": "no",
      });
      res.write(": bothy events\n\n");
      const stream = new EventStream(res, bus, scope, streams, from);
      res.on("close", () => stream.close());
    },
  );
}
