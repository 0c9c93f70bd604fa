/**
 * E2B's volumes (`e2b` 2.51.0 `Volume.create|connect|getInfo|list|destroy`), on bothy's
 * (volumes/volume-service.ts): E2B names a volume by its id and makes it without a size, so it
 * gets E2B_VOLUME_MIB. E2B's volume content API (`/volumecontent/...`: files in a volume without
 * a sandbox) is not served: the `token` answered is empty and opens nothing.
 */
import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { principalOf } from "../auth/auth-hooks.ts";
import type { VolumeService } from "../volumes/volume-service.ts";
import { E2bHttpError, parseE2b as parse } from "./e2b-errors.ts";

/** The size of a volume made through E2B's API, which has none. */
export const E2B_VOLUME_MIB = 1024;

const newVolume = z.object({ name: z.string() });
type ById = { Params: { volumeID: string } };

export function e2bVolumeRoutes(app: FastifyInstance, volumes: VolumeService): void {
  /** The tenant's volume by id; another tenant's is E2B's 404, as one that never existed. */
  const byId = async (tenant: string, id: string): Promise<{ volumeID: string; name: string }> => {
    const found = (await volumes.list(tenant)).find((v) => v.volume_id === id);
    if (!found) throw new E2bHttpError(404, `Volume ${id.slice(0, 64)} not found`);
    return { volumeID: found.volume_id, name: found.name };
  };

  app.post("/volumes", async (request, reply) => {
    const body = parse(newVolume, request.body, "POST /volumes");
    const made = await volumes.create(principalOf(request).tenant, { name: body.name, size_mib: E2B_VOLUME_MIB });
    return reply.code(201).send({ volumeID: made.volume_id, name: made.name, token: "" });
  });

  app.get("/volumes", async (request) =>
    (await volumes.list(principalOf(request).tenant)).map((v) => ({ volumeID: v.volume_id, name: v.name })),
  );

  app.get<ById>("/volumes/:volumeID", async (request) => ({
    ...(await byId(principalOf(request).tenant, request.params.volumeID)),
    token: "",
  }));

  app.delete<ById>("/volumes/:volumeID", async (request, reply) => {
    const { tenant } = principalOf(request);
    await volumes.delete(tenant, (await byId(tenant, request.params.volumeID)).name);
    return reply.code(204).send();
  });
}
