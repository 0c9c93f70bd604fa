/**
 * `/secrets` (scope `secrets`): the tenant's vault. Write-only: no answer carries a value, and a
 * refused body is described by where it is wrong, never by what it held (parse-input.ts names the
 * field and zod's message, which for `value` says only its type or length).
 */
import type { FastifyInstance, FastifyRequest } from "fastify";
import { BothyError, putSecretRequest, secretInfo, secretList, secretName } from "@bothy/protocol";
import { z } from "zod";
import { principalOf, sees } from "../auth/auth-hooks.ts";
import type { Vault } from "../gateway/vault.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { parseInput } from "./parse-input.ts";
import { json } from "./route-schema.ts";

type Named = { Params: { name: string }; Querystring: { tenant?: string } };
const tenantQuery = z.strictObject({ tenant: z.string().min(1).max(64).optional() });

const tags = ["secrets"];
const SECRET = json(secretInfo, "The secret");
const DOCS = {
  put: {
    tags,
    summary:
      "Store a secret in the tenant's vault (scope secrets; `?tenant=` for an admin key), sealed; only the gateway opens it, for the hosts named. No answer ever shows the value",
    querystring: tenantQuery,
    body: putSecretRequest,
    response: {
      201: json(secretInfo, "The secret was new (without its value)"),
      200: json(secretInfo, "The secret was replaced (without its value)"),
    },
  },
  list: {
    tags,
    summary: "The tenant's secrets (every tenant's for an admin key), without their values",
    querystring: tenantQuery,
    response: { 200: json(secretList, "Secrets") },
  },
  get: {
    tags,
    summary: "A secret's hosts and inject rule, without its value",
    querystring: tenantQuery,
    response: { 200: SECRET },
  },
  delete: {
    tags,
    summary: "Remove a secret; sandboxes bound to it keep their placeholder, which the gateway then sends nowhere",
    querystring: tenantQuery,
    response: { 200: json(secretInfo, "The removed secret") },
  },
};

export function secretRoutes(app: FastifyInstance, deps: { vault: Vault; ledger: LedgerStore }): void {
  const { vault, ledger } = deps;

  /** The key's tenant, or the one `?tenant=` names when the key sees it (admin). */
  const tenantOf = async (request: FastifyRequest, query: unknown): Promise<string> => {
    const principal = principalOf(request);
    const asked = parseInput(tenantQuery, query, `${request.method} /secrets`).tenant;
    const tenant = asked ?? principal.tenant;
    if (!sees(principal, tenant) || !(await ledger.auth.tenant(tenant)))
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

  app.put<Named>("/secrets/:name", { schema: DOCS.put }, async (request, reply) => {
    const name = nameOf(request, true);
    const tenant = await tenantOf(request, request.query);
    const body = parseInput(putSecretRequest, request.body, "PUT /secrets/{name}");
    const { created, info } = await vault.put(tenant, name, body);
    return reply.code(created ? 201 : 200).send(info);
  });

  app.get("/secrets", { schema: DOCS.list }, async (request) => {
    const principal = principalOf(request);
    const query = parseInput(tenantQuery, request.query, "GET /secrets");
    // As GET /keys: an admin key sees every tenant's unless it names one.
    if (query.tenant === undefined && principal.scopes.has("admin")) return { secrets: await vault.list() };
    return { secrets: await vault.list(await tenantOf(request, request.query)) };
  });

  app.get<Named>("/secrets/:name", { schema: DOCS.get }, async (request) =>
    vault.info(await tenantOf(request, request.query), nameOf(request)),
  );

  app.delete<Named>("/secrets/:name", { schema: DOCS.delete }, async (request) =>
    vault.delete(await tenantOf(request, request.query), nameOf(request)),
  );
}
