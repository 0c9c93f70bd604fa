/**
 * Snapshots: `POST /sandboxes/{id}/snapshots` and `/fork` act on a sandbox the key sees (the auth
 * hook answers another tenant's as unknown); `/snapshots` lists and deletes the key's tenant's
 * (scopes as any route: `sandboxes:read` to read, `sandboxes:write` to change). Another tenant's
 * snapshot is answered as one that does not exist.
 */
import type { FastifyInstance } from "fastify";
import { createSnapshotRequest, forkRequest, forkResult, snapshotInfo, snapshotList } from "@bothy/protocol";
import { z } from "zod";
import { principalOf } from "../auth/auth-hooks.ts";
import { hasScope } from "../auth/scopes.ts";
import { PRIVATE_SCOPE } from "../network/allow-out.ts";
import type { SnapshotService } from "../snapshots/snapshot-service.ts";
import { json } from "./route-schema.ts";

type ById = { Params: { id: string } };

const tags = ["snapshots"];
const DOCS = {
  create: {
    tags,
    summary:
      "Snapshot a running or asleep sandbox's files: a read-only layer over its template's holding what it wrote (frozen for the copy only); counts against max_storage_mib (429 past it, nothing made). memory: true is 501 on gVisor",
    body: createSnapshotRequest,
    response: { 201: json(snapshotInfo, "The snapshot") },
  },
  fork: {
    tags,
    summary:
      "Snapshot the sandbox and start count sandboxes from it, each with its own identity; all or nothing (quotas checked for all first). Idempotency-Key: a retry answers 200 with the same ones",
    body: forkRequest,
    response: { 201: json(forkResult, "The snapshot and its children"), 200: json(forkResult, "Replayed") },
  },
  list: {
    tags,
    summary: "The tenant's snapshots, each with the live sandboxes started from it",
    response: { 200: json(snapshotList, "Snapshots") },
  },
  get: {
    tags,
    summary: "A snapshot of the tenant, by id or name",
    response: { 200: json(snapshotInfo, "The snapshot") },
  },
  delete: {
    tags,
    summary:
      "Delete a snapshot and its files; refused (409 snapshot_in_use, naming them) while a live sandbox, asleep or not, started from it",
    response: { 200: json(z.object({ deleted: z.string() }), "The id of the deleted snapshot") },
  },
};

export function snapshotRoutes(app: FastifyInstance, snapshots: SnapshotService): void {
  app.post<ById>("/sandboxes/:id/snapshots", { schema: DOCS.create }, async (request, reply) =>
    reply.code(201).send(await snapshots.create(request.params.id, request.body)),
  );

  app.post<ById>("/sandboxes/:id/fork", { schema: DOCS.fork }, async (request, reply) => {
    const key = request.headers["idempotency-key"];
    const { tenant, scopes } = principalOf(request);
    const { result, created } = await snapshots.fork(
      request.params.id,
      request.body,
      Array.isArray(key) ? key[0] : key,
      {
        tenant,
        mayOpenPrivate: hasScope(scopes, PRIVATE_SCOPE),
      },
    );
    return reply.code(created ? 201 : 200).send(result);
  });

  app.get("/snapshots", { schema: DOCS.list }, async (request) => ({
    snapshots: await snapshots.list(principalOf(request).tenant),
  }));

  app.get<ById>("/snapshots/:id", { schema: DOCS.get }, async (request) =>
    snapshots.info(principalOf(request).tenant, request.params.id),
  );

  app.delete<ById>("/snapshots/:id", { schema: DOCS.delete }, async (request) =>
    snapshots.delete(principalOf(request).tenant, request.params.id),
  );
}
