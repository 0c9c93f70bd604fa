/**
 * `/volumes`: the key's tenant's volumes (scopes as any route: `sandboxes:read` to read,
 * `sandboxes:write` to change). Another tenant's volume is answered as one that does not exist.
 */
import type { FastifyInstance } from "fastify";
import { createVolumeRequest, volumeInfo, volumeList } from "@bothy/protocol";
import { z } from "zod";
import { principalOf } from "../auth/auth-hooks.ts";
import type { VolumeService } from "../volumes/volume-service.ts";
import { json } from "./route-schema.ts";

type Named = { Params: { name: string } };

const tags = ["volumes"];
const DOCS = {
  create: {
    tags,
    summary:
      "Make a volume: an ext4 file system of size_mib that outlives sandboxes (a create mounts it with `volumes`); counts against the tenant's max_storage_mib (429 past it, nothing made)",
    body: createVolumeRequest,
    response: { 201: json(volumeInfo, "The volume") },
  },
  list: {
    tags,
    summary: "The tenant's volumes, each with the live sandboxes that mount it",
    response: { 200: json(volumeList, "Volumes") },
  },
  get: { tags, summary: "A volume of the tenant, by name", response: { 200: json(volumeInfo, "The volume") } },
  delete: {
    tags,
    summary:
      "Delete a volume and its files; refused (409 volume_in_use, naming them) while a live sandbox, asleep or not, mounts it",
    response: { 200: json(z.object({ deleted: z.string() }), "The name of the deleted volume") },
  },
};

export function volumeRoutes(app: FastifyInstance, volumes: VolumeService): void {
  app.post("/volumes", { schema: DOCS.create }, async (request, reply) =>
    reply.code(201).send(await volumes.create(principalOf(request).tenant, request.body)),
  );

  app.get("/volumes", { schema: DOCS.list }, async (request) => ({
    volumes: await volumes.list(principalOf(request).tenant),
  }));

  app.get<Named>("/volumes/:name", { schema: DOCS.get }, async (request) =>
    volumes.info(principalOf(request).tenant, request.params.name),
  );

  app.delete<Named>("/volumes/:name", { schema: DOCS.delete }, async (request) =>
    volumes.delete(principalOf(request).tenant, request.params.name),
  );
}
