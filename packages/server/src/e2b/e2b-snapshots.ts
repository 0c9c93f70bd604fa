/**
 * E2B's snapshots (`e2b` 2.51.0 `createSnapshot`, `listSnapshots`, `deleteSnapshot`, `fork`), on
 * bothy's (snapshots/snapshot-service.ts); `Sandbox.create(snapshotId)` is the control plane's
 * create. A snapshot keeps the sandbox's files (on gVisor, bothy's snapshots hold no memory); E2B
 * names it by its id (`snap_…`), and its `names` are bothy's one optional name. Another tenant's
 * snapshot or sandbox is E2B's 404, as one that never existed.
 */
import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { SNAPSHOT_ID_RE, type SandboxInfo, type SnapshotInfo } from "@bothy/protocol";
import { principalOf } from "../auth/auth-hooks.ts";
import type { Principal } from "../auth/key-ring.ts";
import { hasScope } from "../auth/scopes.ts";
import { PRIVATE_SCOPE } from "../network/allow-out.ts";
import type { SnapshotService } from "../snapshots/snapshot-service.ts";
import { E2bHttpError, parseE2b as parse } from "./e2b-errors.ts";
import type { E2bState } from "./e2b-state.ts";

const MAX_PAGE = 100;
const newSnapshot = z.object({ name: z.string().optional() });
const listQuery = z.object({
  sandboxID: z.string().optional(),
  name: z.string().optional(),
  limit: z.coerce.number().int().min(1).max(MAX_PAGE).optional(),
  nextToken: z.string().optional(),
});
const forkBody = z.object({ timeout: z.number().int().optional(), count: z.number().int().optional() });

type Params = { Params: { id: string } };

/**
 * E2B's SnapshotInfo, and `memory` (bothy's own field: whether it kept memory and processes; the
 * `e2b` SDK passes over fields it does not know, a raw client reads it).
 */
function shape(snapshot: SnapshotInfo): { snapshotID: string; names: string[]; memory: boolean } {
  return {
    snapshotID: snapshot.snapshot_id,
    names: snapshot.name === null ? [] : [snapshot.name],
    memory: snapshot.memory,
  };
}

export function e2bSnapshotRoutes(
  app: FastifyInstance,
  snapshots: SnapshotService,
  state: E2bState,
  /** The connection shape create and connect answer (control-plane.ts), for each fork child. */
  connection: (info: SandboxInfo, principal: Principal) => Record<string, unknown>,
): void {
  app.post<Params>("/sandboxes/:id/snapshots", async (request, reply) => {
    const body = parse(newSnapshot, request.body, "POST /sandboxes/{id}/snapshots");
    const made = await snapshots.create(request.params.id, body.name === undefined ? {} : { name: body.name });
    return reply.code(201).send(shape(made));
  });

  /** Oldest first; `nextToken` is the id of the last one shown. */
  app.get("/snapshots", async (request, reply) => {
    const query = parse(listQuery, request.query, "GET /snapshots");
    const all = (await snapshots.list(principalOf(request).tenant))
      .filter(
        (s) =>
          (query.sandboxID === undefined || s.source_sandbox_id === query.sandboxID) &&
          (query.name === undefined || s.name === query.name),
      )
      .sort((a, b) =>
        a.created_at === b.created_at
          ? a.snapshot_id.localeCompare(b.snapshot_id)
          : a.created_at < b.created_at
            ? -1
            : 1,
      );
    const start = query.nextToken === undefined ? 0 : all.findIndex((s) => s.snapshot_id === query.nextToken) + 1;
    if (start === 0 && query.nextToken !== undefined)
      throw new E2bHttpError(400, "nextToken is not one this server gave out");
    const page = all.slice(start, start + (query.limit ?? MAX_PAGE));
    const last = page.at(-1);
    if (last && start + page.length < all.length) reply.header("x-next-token", last.snapshot_id);
    return page.map(shape);
  });

  /** `deleteSnapshot`: E2B deletes a snapshot as a template; bothy's templates are not deleted through E2B. */
  app.delete<{ Params: { templateID: string } }>("/templates/:templateID", async (request, reply) => {
    const id = request.params.templateID;
    if (!SNAPSHOT_ID_RE.test(id))
      throw new E2bHttpError(
        404,
        `No snapshot ${id.slice(0, 64)}; bothy's templates are managed with \`bothy template\`.`,
      );
    await snapshots.delete(principalOf(request).tenant, id);
    return reply.code(204).send();
  });

  /**
   * `fork`: a snapshot of the sandbox and `count` sandboxes started from it, each with the
   * parent's envVars and its own tokens. bothy's fork is all or nothing: a failure is the call's
   * error, never a partial list.
   */
  app.post<Params>("/sandboxes/:id/fork", async (request) => {
    const body = parse(forkBody, request.body, "POST /sandboxes/{id}/fork");
    const principal = principalOf(request);
    const { result } = await snapshots.fork(
      request.params.id,
      { count: body.count ?? 1, ...(body.timeout === undefined ? {} : { timeout_s: body.timeout }) },
      undefined,
      { tenant: principal.tenant, mayOpenPrivate: hasScope(principal.scopes, PRIVATE_SCOPE) },
    );
    await state.ready(request.params.id);
    const env = state.env(request.params.id);
    await Promise.all(result.sandboxes.map((child) => state.setEnv(child.sandbox_id, env)));
    return result.sandboxes.map((child) => ({ sandbox: connection(child, principal) }));
  });
}
