import type { FastifyInstance } from "fastify";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";

export function sandboxRoutes(app: FastifyInstance, manager: SandboxManager, startedAt: number): void {
  app.post("/sandboxes", async (request, reply) => {
    const key = request.headers["idempotency-key"];
    const { sandbox, created } = await manager.create(request.body, Array.isArray(key) ? key[0] : key);
    return reply.code(created ? 201 : 200).send(sandbox);
  });

  app.get("/sandboxes", async () => ({ sandboxes: manager.list() }));

  app.get<{ Params: { id: string } }>("/sandboxes/:id", async (request) => manager.info(request.params.id));

  app.delete<{ Params: { id: string } }>("/sandboxes/:id", async (request) => manager.delete(request.params.id));

  app.get("/healthz", async () => {
    const counts = manager.counts();
    return {
      status: "ok",
      uptime_s: Math.round((Date.now() - startedAt) / 100) / 10,
      sandboxes: { creating: 0, running: 0, deleting: 0, deleted: 0, failed: 0, ...counts },
    };
  });
}
