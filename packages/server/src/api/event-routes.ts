import type { FastifyInstance } from "fastify";
import { BothyError, SANDBOX_ID_RE, type BothyEvent } from "@bothy/protocol";
import { principalOf, sees } from "../auth/auth-hooks.ts";
import type { EventBus } from "../events/event-bus.ts";
import type { EventStreams } from "../events/event-streams.ts";

const KEEPALIVE_MS = 15_000;

/**
 * `GET /events`: Server-Sent Events. `?sandbox_id=` filters; `Last-Event-ID` (or `?since=`)
 * replays what was missed from the ledger before live events follow. A key sees its tenant's
 * events only (an admin key every event, host-wide ones included).
 */
export function eventRoutes(app: FastifyInstance, bus: EventBus, streams: EventStreams): void {
  app.get<{ Querystring: { sandbox_id?: string; since?: string } }>("/events", async (request, reply) => {
    const { sandbox_id: sandboxId, since } = request.query;
    if (sandboxId !== undefined && !SANDBOX_ID_RE.test(sandboxId))
      throw new BothyError("invalid_sandbox_id", "sandbox_id must be a sandbox id (sbx_ and 20 letters and digits).");
    const lastId = request.headers["last-event-id"] ?? since;
    const from = lastId === undefined ? undefined : Number(lastId);
    if (from !== undefined && (!Number.isInteger(from) || from < 0))
      throw new BothyError("invalid_request", "Last-Event-ID and since are event sequence numbers (integers >= 0).");

    const principal = principalOf(request);
    const visible = (tenant: string | null): boolean =>
      tenant === null ? principal.scopes.has("admin") : sees(principal, tenant);
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, {
      "content-type": "text/event-stream",
      "cache-control": "no-cache",
      connection: "keep-alive",
      "x-accel-buffering": "no",
    });
    res.write(": bothy events\n\n");
    const write = (ev: BothyEvent, tenant: string | null): void => {
      if (sandboxId !== undefined && ev.sandbox_id !== sandboxId) return;
      if (!visible(tenant)) return;
      res.write(`id: ${ev.seq}\nevent: ${ev.type}\ndata: ${JSON.stringify(ev)}\n\n`);
    };
    // Replay and subscribe happen in one synchronous run (the ledger is synchronous), so no event
    // can fall between them.
    if (from !== undefined) {
      let cursor = from;
      for (
        let batch = bus.sinceWithTenant(cursor, sandboxId);
        batch.length > 0;
        batch = bus.sinceWithTenant(cursor, sandboxId)
      ) {
        streams.read(batch.length);
        for (const { event, tenant } of batch) write(event, tenant);
        cursor = batch.at(-1)?.event.seq ?? cursor;
      }
    }
    const unsubscribe = bus.subscribe(write);
    const untrack = streams.track({ res, state: () => "live" });
    const keepalive = setInterval(() => res.write(": keepalive\n\n"), KEEPALIVE_MS);
    request.raw.on("close", () => {
      clearInterval(keepalive);
      unsubscribe();
      untrack();
    });
  });
}
