/**
 * `/policy`: the tenant's default host policy, applied before every one of its sandboxes' own
 * rules (gateway/host-policy.ts). Any key reads its tenant's; setting it needs scope `policy`;
 * an admin key names another tenant with `?tenant=`.
 */
import type { FastifyInstance } from "fastify";
import { BothyError, hostPolicyRequest, TENANT_ID_RE, tenantPolicyInfo } from "@bothy/protocol";
import { z } from "zod";
import { principalOf, sees } from "../auth/auth-hooks.ts";
import type { GatewayPolicies } from "../gateway/policies.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { parseInput } from "./parse-input.ts";
import { json } from "./route-schema.ts";

type TenantQuery = { Querystring: { tenant?: string } };

const tags = ["policy"];
const querystring = z.object({ tenant: z.string().optional() });
const DOCS = {
  get: {
    tags,
    summary:
      "The tenant's default host policy, applied before every one of its sandboxes' own rules (`?tenant=` for an admin key)",
    querystring,
    response: { 200: json(tenantPolicyInfo, "The policy") },
  },
  put: {
    tags,
    summary: "Set the tenant's default host policy (scope policy); its sandboxes' next requests are judged by it",
    querystring,
    body: hostPolicyRequest,
    response: { 200: json(tenantPolicyInfo, "The policy") },
  },
  delete: {
    tags,
    summary: "Remove the tenant's default host policy (scope policy)",
    querystring,
    response: { 200: json(tenantPolicyInfo, "The policy, now null") },
  },
};

export function policyRoutes(app: FastifyInstance, deps: { policies: GatewayPolicies; ledger: LedgerStore }): void {
  const { policies, ledger } = deps;
  const tenantOf = async (
    request: { query: { tenant?: string } },
    principal: ReturnType<typeof principalOf>,
  ): Promise<string> => {
    const tenant = request.query.tenant ?? principal.tenant;
    if (!TENANT_ID_RE.test(tenant) || !sees(principal, tenant) || !(await ledger.auth.tenant(tenant)))
      throw new BothyError("tenant_not_found", `No tenant ${tenant.slice(0, 64)}; GET /tenants lists them.`);
    return tenant;
  };
  const view = async (tenant: string) => ({ tenant, policy: (await policies.tenantPolicy(tenant)) ?? null });

  app.get<TenantQuery>("/policy", { schema: DOCS.get }, async (request) =>
    view(await tenantOf(request, principalOf(request))),
  );

  app.put<TenantQuery>("/policy", { schema: DOCS.put }, async (request) => {
    const tenant = await tenantOf(request, principalOf(request));
    const policy = parseInput(hostPolicyRequest, request.body, "PUT /policy");
    await policies.setTenantPolicy(tenant, policy);
    return view(tenant);
  });

  app.delete<TenantQuery>("/policy", { schema: DOCS.delete }, async (request) => {
    const tenant = await tenantOf(request, principalOf(request));
    await policies.setTenantPolicy(tenant, null);
    return view(tenant);
  });
}
