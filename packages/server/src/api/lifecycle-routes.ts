import type { FastifyInstance } from "fastify";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";

/** A sandbox's lifetime: `POST /sandboxes/{id}/timeout {"timeout_s": N}` makes it expire N s from now. */
export function lifecycleRoutes(app: FastifyInstance, manager: SandboxManager): void {
  app.post<{ Params: { id: string } }>("/sandboxes/:id/timeout", async (request) =>
    manager.setTimeout(request.params.id, request.body),
  );
}
