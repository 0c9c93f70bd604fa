/**
 * `/secrets` (scope `secrets`): the tenant's vault. Write-only: no answer carries a value, and a
 * refused body is described by where it is wrong, never by what it held (parse-input.ts names the
 * field and zod's message, which for `value` says only its type or length).
 */
import type { FastifyInstance, FastifyRequest } from "fastify";
import { BothyError, putSecretRequest, secretName } from "@bothy/protocol";
import { z } from "zod";
import { principalOf, sees } from "../auth/auth-hooks.ts";
import type { Vault } from "../gateway/vault.ts";
import type { Ledger } from "../ledger/ledger.ts";
import { parseInput } from "./parse-input.ts";

type Named = { Params: { name: string }; Querystring: { tenant?: string } };
const tenantQuery = z.strictObject({ tenant: z.string().min(1).max(64).optional() });

export function secretRoutes(app: FastifyInstance, deps: { vault: Vault; ledger: Ledger }): void {
  const { vault, ledger } = deps;

  /** The key's tenant, or the one `?tenant=` names when the key sees it (admin). */
  const tenantOf = (request: FastifyRequest, query: unknown): string => {
    const principal = principalOf(request);
    const asked = parseInput(tenantQuery, query, `${request.method} /secrets`).tenant;
    const tenant = asked ?? principal.tenant;
    if (!sees(principal, tenant) || !ledger.auth.tenant(tenant))
      throw new BothyError("tenant_not_found", `No tenant ${tenant.slice(0, 64)}; GET /tenants lists them.`);
    return tenant;
  };
  /** A name that cannot exist is not found when read, and refused when written. */
  const nameOf = (request: FastifyRequest<Named>, writing = false): string => {
    const { name } = request.params;
    if (!secretName.safeParse(name).success)
      throw writing
        ? new BothyError(
            "invalid_request",
            "A secret's name is a lower-case letter, then up to 62 lower-case letters, digits and _ (it becomes the sandbox's upper-case variable).",
          )
        : new BothyError(
            "secret_not_found",
            `No secret ${name.slice(0, 64)}: a secret's name is lower-case letters, digits and _ (GET /secrets lists them).`,
          );
    return name;
  };

  app.put<Named>("/secrets/:name", async (request, reply) => {
    const name = nameOf(request, true);
    const tenant = tenantOf(request, request.query);
    const body = parseInput(putSecretRequest, request.body, "PUT /secrets/{name}");
    const { created, info } = vault.put(tenant, name, body);
    return reply.code(created ? 201 : 200).send(info);
  });

  app.get("/secrets", async (request) => {
    const principal = principalOf(request);
    const query = parseInput(tenantQuery, request.query, "GET /secrets");
    // As GET /keys: an admin key sees every tenant's unless it names one.
    if (query.tenant === undefined && principal.scopes.has("admin")) return { secrets: vault.list() };
    return { secrets: vault.list(tenantOf(request, request.query)) };
  });

  app.get<Named>("/secrets/:name", async (request) => vault.info(tenantOf(request, request.query), nameOf(request)));

  app.delete<Named>("/secrets/:name", async (request) =>
    vault.delete(tenantOf(request, request.query), nameOf(request)),
  );
}
