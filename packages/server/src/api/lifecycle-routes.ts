import type { FastifyInstance } from "fastify";
import { sandboxInfo, setTimeoutRequest } from "@bothy/protocol";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import { json } from "./route-schema.ts";

const timeoutDoc = {
  tags: ["sandboxes"],
  summary: "Expire the sandbox timeout_s seconds from now",
  body: setTimeoutRequest,
  response: { 200: json(sandboxInfo, "The sandbox") },
};

/** A sandbox's lifetime: `POST /sandboxes/{id}/timeout {"timeout_s": N}` makes it expire N s from now. */
export function lifecycleRoutes(app: FastifyInstance, manager: SandboxManager): void {
  app.post<{ Params: { id: string } }>("/sandboxes/:id/timeout", { schema: timeoutDoc }, async (request) =>
    manager.setTimeout(request.params.id, request.body),
  );
}
