import type { FastifyInstance } from "fastify";
import {
  BothyError,
  SANDBOX_ID_RE,
  createSandboxRequest,
  healthz,
  sandboxDeleteQuery,
  sandboxInfo,
  sandboxList,
} from "@bothy/protocol";
import { principalOf } from "../auth/auth-hooks.ts";
import type { Quotas } from "../auth/quotas.ts";
import { hasScope } from "../auth/scopes.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { PRIVATE_SCOPE } from "../network/allow-out.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import { parseInput } from "./parse-input.ts";
import { json } from "./route-schema.ts";

const SANDBOX = json(sandboxInfo, "The sandbox");
const tags = ["sandboxes"];

/** Routes that talk to a sandbox's agent: a paused sandbox is resumed before they run. */
const AGENT_ROUTE = /^\/sandboxes\/:id\/(command|commands\/|files|ports|desktop|tunnel)/;
/** Plain HTTP calls to the agent and proxied connections: no sleep while one runs. */
const FILE_ROUTE = /^\/sandboxes\/:id\/(files|ports|desktop|tunnel)/;

export function sandboxRoutes(
  app: FastifyInstance,
  deps: { manager: SandboxManager; ledger: LedgerStore; quotas: Quotas },
  startedAt: number,
): void {
  const { manager, ledger, quotas } = deps;
  // Registered before the command and file routes, and run before their own checks.
  app.addHook("preValidation", async (request, reply) => {
    const id = (request.params as { id?: unknown } | undefined)?.id;
    if (typeof id !== "string" || !SANDBOX_ID_RE.test(id) || !AGENT_ROUTE.test(request.routeOptions.url ?? "")) return;
    await manager.ensureRunning(id);
    // Held until the response is done or the client is gone (a transfer can outlast the idle timeout).
    if (FILE_ROUTE.test(request.routeOptions.url ?? "")) reply.raw.once("close", manager.hold(id));
  });

  const createDoc = {
    tags,
    summary: "Create a sandbox (Idempotency-Key header: replay answers 200 and the same sandbox)",
    body: createSandboxRequest,
    response: { 201: SANDBOX, 200: json(sandboxInfo, "Replayed Idempotency-Key: the sandbox made before") },
  };
  app.post("/sandboxes", { schema: createDoc }, async (request, reply) => {
    // JSON null is a body, not an absent one (which means the defaults).
    if (request.body === null)
      throw new BothyError("invalid_request", "POST /sandboxes takes a JSON object, or no body for the defaults.");
    const key = request.headers["idempotency-key"];
    const { tenant, scopes } = principalOf(request);
    const { sandbox, created } = await manager.create(request.body, Array.isArray(key) ? key[0] : key, {
      tenant,
      mayOpenPrivate: hasScope(scopes, PRIVATE_SCOPE),
      admit: (size) => quotas.admit(tenant, size),
    });
    return reply.code(created ? 201 : 200).send(sandbox);
  });

  const listDoc = { tags, summary: "List live sandboxes", response: { 200: json(sandboxList, "Live sandboxes") } };
  app.get("/sandboxes", { schema: listDoc }, async (request) => {
    const principal = principalOf(request);
    const mine = principal.scopes.has("admin") ? undefined : await ledger.auth.sandboxIdsOf(principal.tenant);
    return { sandboxes: (await manager.list()).filter((s) => mine === undefined || mine.has(s.sandbox_id)) };
  });

  const showDoc = { tags, summary: "Show a sandbox (also once deleted)", response: { 200: SANDBOX } };
  app.get<{ Params: { id: string } }>("/sandboxes/:id", { schema: showDoc }, async (request) =>
    manager.info(request.params.id),
  );

  const deleteDoc = {
    tags,
    summary: "Delete a sandbox (idempotent): answers once it is deleting, or with wait=true once deleted",
    querystring: sandboxDeleteQuery,
    response: { 200: SANDBOX },
  };
  app.delete<{ Params: { id: string }; Querystring: Record<string, string> }>(
    "/sandboxes/:id",
    { schema: deleteDoc },
    async (request) => {
      const { wait } = parseInput(sandboxDeleteQuery, request.query, "DELETE /sandboxes/{id}[?wait=true]");
      return manager.delete(request.params.id, "requested", { wait: wait ?? false });
    },
  );

  const pauseDoc = { tags, summary: "Pause: memory to disk, VM ended (QEMU)", response: { 200: SANDBOX } };
  app.post<{ Params: { id: string } }>("/sandboxes/:id/pause", { schema: pauseDoc }, async (request) =>
    manager.pause(request.params.id),
  );

  const resumeDoc = { tags, summary: "Resume a paused sandbox", response: { 200: SANDBOX } };
  app.post<{ Params: { id: string } }>("/sandboxes/:id/resume", { schema: resumeDoc }, async (request) =>
    manager.resume(request.params.id),
  );

  const healthDoc = {
    tags: ["server"],
    summary: "Liveness and sandbox counts",
    response: { 200: json(healthz, "Healthy") },
  };
  app.get("/healthz", { schema: healthDoc }, async () => {
    const counts = await manager.counts();
    return {
      status: "ok",
      uptime_s: Math.round((Date.now() - startedAt) / 100) / 10,
      sandboxes: { creating: 0, running: 0, paused: 0, deleting: 0, deleted: 0, failed: 0, ...counts },
    };
  });
}
