/**
 * `/keys` (scope keys:manage: a key mints keys only within its own scopes, tenant and life) and
 * `/tenants` with their quotas (scope admin).
 */
import type { FastifyInstance } from "fastify";
import {
  apiKeyInfo,
  BothyError,
  createdKey,
  createKeyRequest,
  createTenantRequest,
  KEY_ID_RE,
  keyList,
  tenantDeleted,
  tenantInfo,
  tenantList,
  tenantQuota,
  type TenantQuota,
} from "@bothy/protocol";
import { principalOf, sees } from "../auth/auth-hooks.ts";
import { keyView, type KeyRing } from "../auth/key-ring.ts";
import type { Quotas } from "../auth/quotas.ts";
import { DEFAULT_SCOPES, hasScope } from "../auth/scopes.ts";
import type { KeyConnections } from "../auth/auth-hooks.ts";
import type { TenantHoldings } from "../ledger/auth-rows.ts";
import { DEFAULT_TENANT } from "../ledger/ledger.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { parseInput } from "./parse-input.ts";
import { json } from "./route-schema.ts";

const keys = ["keys"];
const tenants = ["tenants"];
const TENANT = json(tenantInfo, "The tenant");
const DOCS = {
  mint: {
    tags: keys,
    summary:
      "Make an API key (scope keys:manage); its scopes must be within the calling key's, and it expires no later than the calling key. The answer is the only time the key is shown",
    body: createKeyRequest,
    response: { 201: json(createdKey, "The key, with `key` itself") },
  },
  keys: {
    tags: keys,
    summary: "The tenant's API keys (every tenant's for an admin key), without the keys themselves",
    response: { 200: json(keyList, "Keys") },
  },
  revoke: {
    tags: keys,
    summary:
      "Revoke a key: refused from the next request on; its open WebSockets and event streams end, and so do the links and E2B access tokens it made",
    response: { 200: json(apiKeyInfo, "The revoked key") },
  },
  create: {
    tags: tenants,
    summary: "Make a tenant, with its quotas (scope admin)",
    body: createTenantRequest,
    response: { 201: TENANT },
  },
  tenants: {
    tags: tenants,
    summary: "Every tenant, its quotas and what it uses now (scope admin)",
    response: { 200: json(tenantList, "Tenants") },
  },
  tenant: {
    tags: tenants,
    summary: "A tenant, its quotas and what it uses now (scope admin)",
    response: { 200: TENANT },
  },
  remove: {
    tags: tenants,
    summary:
      "Delete a tenant (scope admin); refused (409 tenant_in_use, naming what it holds) while it has live sandboxes, unrevoked keys, secrets, volumes or snapshots. Its history stays under its name, which is not given again",
    response: { 200: json(tenantDeleted, "The id of the deleted tenant") },
  },
  quota: {
    tags: tenants,
    summary: "Change a tenant's quotas: those named are set, null lifts one (scope admin)",
    body: tenantQuota,
    response: { 200: TENANT },
  },
};

type Id = { Params: { id: string } };

/** What a tenant still holds, in words, with what to do about each. */
function tenantInUse(id: string, holdings: TenantHoldings): BothyError {
  const steps: Record<keyof TenantHoldings, [string, string]> = {
    sandboxes: ["live sandbox", "delete its sandboxes"],
    keys: ["API key", "revoke its keys"],
    secrets: ["secret", "delete its secrets"],
    volumes: ["volume", "delete its volumes"],
    snapshots: ["snapshot", "delete its snapshots"],
  };
  const held = (Object.keys(steps) as Array<keyof TenantHoldings>).filter((k) => holdings[k] > 0);
  const has = held.map((k) => `${holdings[k]} ${steps[k][0]}${holdings[k] === 1 ? "" : "s"}`).join(", ");
  return new BothyError(
    "tenant_in_use",
    `Tenant ${id} still has ${has}; ${held.map((k) => steps[k][1]).join(", ")}, then delete it again.`,
    { details: Object.fromEntries(held.map((k) => [k, holdings[k]])) },
  );
}

export function authRoutes(
  app: FastifyInstance,
  deps: { ring: KeyRing; ledger: LedgerStore; quotas: Quotas; connections: KeyConnections },
): void {
  const { ring, ledger, quotas, connections } = deps;
  const keyNotFound = (id: string): BothyError =>
    new BothyError("key_not_found", `No API key ${id.slice(0, 64)}; GET /keys lists them.`);
  const tenantNotFound = (id: string): BothyError =>
    new BothyError("tenant_not_found", `No tenant ${id.slice(0, 64)}; GET /tenants lists them.`);
  const tenantView = async (id: string) => {
    const row = await ledger.auth.tenant(id);
    if (!row) throw tenantNotFound(id);
    return {
      tenant: row.id,
      quota: await quotas.quotaOf(row.id),
      created_at: row.created_at,
      live: await ledger.auth.liveUsage(id),
    };
  };

  app.post("/keys", { schema: DOCS.mint }, async (request, reply) => {
    const principal = principalOf(request);
    const body = parseInput(createKeyRequest, request.body, "POST /keys");
    const tenant = body.tenant ?? principal.tenant;
    if (!sees(principal, tenant)) throw tenantNotFound(tenant);
    if (!(await ledger.auth.tenant(tenant))) throw tenantNotFound(tenant);
    const scopes = body.scopes ?? DEFAULT_SCOPES.filter((s) => hasScope(principal.scopes, s));
    const beyond = scopes.filter((s) => !hasScope(principal.scopes, s));
    if (beyond.length > 0)
      throw new BothyError(
        "scope_missing",
        `A key mints keys only within its own scopes; this one lacks ${beyond.join(", ")}.`,
        { details: { scope: beyond[0] } },
      );
    const now = Date.now();
    const expiresAt = body.expires_in_s === undefined ? null : new Date(now + body.expires_in_s * 1000).toISOString();
    // A key with an expiry cannot extend itself through the keys it makes.
    const own = principal.keyId === null ? null : ((await ledger.auth.key(principal.keyId))?.expires_at ?? null);
    if (own !== null && (expiresAt === null || Date.parse(expiresAt) > Date.parse(own))) {
      const most = Math.max(0, Math.floor((Date.parse(own) - now) / 1000));
      throw new BothyError(
        "invalid_request",
        `This key expires at ${own}; a key it makes must expire no later: send expires_in_s of at most ${most}, or make the key with one that does not expire.`,
        { details: { max_expires_in_s: most } },
      );
    }
    const { key, view } = await ring.mint({ tenant, name: body.name, scopes, expiresAt });
    return reply.code(201).send({ ...view, key });
  });

  app.get("/keys", { schema: DOCS.keys }, async (request) => {
    const principal = principalOf(request);
    const rows = await (principal.scopes.has("admin") ? ledger.auth.keys() : ledger.auth.keys(principal.tenant));
    return { keys: rows.map(keyView) };
  });

  app.delete<Id>("/keys/:id", { schema: DOCS.revoke }, async (request) => {
    const principal = principalOf(request);
    const { id } = request.params;
    const row = KEY_ID_RE.test(id) ? await ledger.auth.key(id) : undefined;
    if (!row || !sees(principal, row.tenant)) throw keyNotFound(id);
    // As with minting: a key revokes only keys within its own scopes (not a stronger one).
    const beyond = keyView(row).scopes.filter((s) => !hasScope(principal.scopes, s));
    if (beyond.length > 0)
      throw new BothyError(
        "scope_missing",
        `A key revokes only keys within its own scopes; key ${id} has ${beyond.join(", ")}, which this one lacks.`,
        { details: { scope: beyond[0] } },
      );
    await ring.revoke(id);
    connections.end(id);
    const after = await ledger.auth.key(id);
    if (!after) throw keyNotFound(id);
    return keyView(after);
  });

  app.post("/tenants", { schema: DOCS.create }, async (request, reply) => {
    const body = parseInput(createTenantRequest, request.body, "POST /tenants");
    if (await ledger.auth.tenantHasHistory(body.tenant))
      throw new BothyError(
        "tenant_exists",
        `Tenant ${body.tenant} existed and was deleted; its history is kept under that name, so pick another.`,
      );
    if (!(await ledger.auth.insertTenant(body.tenant, JSON.stringify(body.quota ?? {}))))
      throw new BothyError("tenant_exists", `Tenant ${body.tenant} exists; GET /tenants/${body.tenant} shows it.`);
    return reply.code(201).send(await tenantView(body.tenant));
  });

  app.get("/tenants", { schema: DOCS.tenants }, async () => ({
    tenants: await Promise.all((await ledger.auth.tenants()).map((t) => tenantView(t.id))),
  }));

  app.get<Id>("/tenants/:id", { schema: DOCS.tenant }, async (request) => tenantView(request.params.id));

  app.delete<Id>("/tenants/:id", { schema: DOCS.remove }, async (request) => {
    const { id } = request.params;
    // The tenant a server without keys acts as (BOTHY_AUTH=none) and its first admin key's.
    if (id === DEFAULT_TENANT)
      throw new BothyError("tenant_in_use", `Tenant ${DEFAULT_TENANT} is the server's own and is never deleted.`);
    const outcome = await ledger.auth.deleteTenant(id);
    if (outcome === undefined) throw tenantNotFound(id);
    if (outcome !== "deleted") throw tenantInUse(id, outcome);
    return { deleted: id };
  });

  /** Sets the quotas named in the body; null lifts one, an absent one stays as it was. */
  app.patch<Id>("/tenants/:id/quota", { schema: DOCS.quota }, async (request) => {
    const { id } = request.params;
    if (!(await ledger.auth.tenant(id))) throw tenantNotFound(id);
    const change = parseInput(tenantQuota, request.body, `PATCH /tenants/{id}/quota`);
    const merged: TenantQuota = { ...(await quotas.quotaOf(id)), ...change };
    for (const k of Object.keys(merged) as Array<keyof TenantQuota>) if (merged[k] === null) delete merged[k];
    await ledger.auth.setQuota(id, JSON.stringify(merged));
    return tenantView(id);
  });
}
