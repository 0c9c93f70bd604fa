/** API keys, tenants and quotas: request and answer bodies of /keys and /tenants. */
import { z } from "zod";

export const API_SCOPES = [
  "sandboxes:read",
  "sandboxes:write",
  "files",
  "corpus",
  "conversations",
  "keys:manage",
  /** Write the tenant's vault secrets (`/secrets`); no route ever reads a value back. */
  "secrets",
  /** Set the tenant's default host policy (`PUT /policy`). */
  "policy",
  /** List and decide the tenant's approvals; never given to a key by default. */
  "approvals:decide",
  /**
   * Open private and metadata addresses with `allow_out` (within BOTHY_ALLOW_OUT_PERMIT); never
   * given to a key by default, and a key can mint it only if it holds it.
   */
  "network:private",
  "admin",
] as const;
export const apiScope = z.enum(API_SCOPES);

export const TENANT_ID_RE = /^[a-z0-9][a-z0-9-]{0,62}$/;
export const KEY_ID_RE = /^key_[a-z2-7]{20}$/;

export const createKeyRequest = z.strictObject({
  name: z.string().min(1).max(100).default("unnamed"),
  /** Default: everything but keys:manage and admin, as far as the calling key holds them. */
  scopes: z.array(apiScope).min(1).optional(),
  /** The tenant the key acts in; only an admin key may name another than its own. */
  tenant: z.string().regex(TENANT_ID_RE, "a tenant id: lower-case letters, digits and -").optional(),
  /** Seconds until it expires; default never (required, and no later than its own expiry, from a key that expires). */
  expires_in_s: z
    .number()
    .int()
    .positive()
    .max(10 * 366 * 86400)
    .optional(),
});
export type CreateKeyRequest = z.input<typeof createKeyRequest>;

export const apiKeyInfo = z.object({
  key_id: z.string(),
  tenant: z.string(),
  name: z.string(),
  /** The key's first characters and last 4, to tell keys apart. */
  display: z.string(),
  scopes: z.array(apiScope),
  created_at: z.string(),
  expires_at: z.string().nullable(),
  revoked_at: z.string().nullable(),
  last_used_at: z.string().nullable(),
});
export type ApiKeyInfo = z.infer<typeof apiKeyInfo>;

/** The answer to a create: the only time the key itself is shown. */
export const createdKey = apiKeyInfo.extend({ key: z.string() });
export const keyList = z.object({ keys: z.array(apiKeyInfo) });

const limit = z.number().positive().nullable().optional();
/** Per-tenant limits; an absent or null one is unlimited (the host's own limits still hold). */
export const tenantQuota = z.strictObject({
  max_sandboxes: z.number().int().positive().nullable().optional(),
  max_vcpu: z.number().int().positive().nullable().optional(),
  max_memory_mib: z.number().int().positive().nullable().optional(),
  creates_per_minute: z.number().int().positive().nullable().optional(),
  monthly_vcpu_hours: limit,
  monthly_gib_hours: limit,
  /** Total MiB of the tenant's volumes and snapshots: a volume or snapshot past it is refused. */
  max_storage_mib: z.number().int().positive().nullable().optional(),
});
export type TenantQuota = z.infer<typeof tenantQuota>;

export const createTenantRequest = z.strictObject({
  tenant: z.string().regex(TENANT_ID_RE, "a tenant id: lower-case letters, digits and -, at most 63"),
  quota: tenantQuota.optional(),
});

export const tenantInfo = z.object({
  tenant: z.string(),
  quota: tenantQuota,
  created_at: z.string(),
  live: z.object({ sandboxes: z.number(), vcpu: z.number(), memory_mib: z.number() }),
});
export const tenantList = z.object({ tenants: z.array(tenantInfo) });
/** The answer to `DELETE /tenants/{id}`. */
export const tenantDeleted = z.object({ deleted: z.string() });

/** A sign-in link's one-time token (`bothy ui-link`): 32 random bytes, base64url. */
export const UI_LINK_TOKEN_RE = /^[A-Za-z0-9_-]{43}$/;

/**
 * `POST /ui/session`: the dashboard's sign-in, with the key in the body (never in a URL), or with
 * the one-time token of a sign-in link (`bothy ui-link`), which dies on this use.
 */
export const uiSignInRequest = z.union([
  z.object({ key: z.string().min(1, "key must not be empty").max(256) }).strict(),
  z.object({ link: z.string().regex(UI_LINK_TOKEN_RE, "a sign-in link's token (43 base64url characters)") }).strict(),
]);

/** `POST /ui/links`: a one-time sign-in link for the calling key, valid `ttl_s` seconds. */
export const uiLinkRequest = z.strictObject({ ttl_s: z.number().int().min(30).max(3600).default(300) });
export type UiLinkRequest = z.input<typeof uiLinkRequest>;

/**
 * A sign-in link: `path` (`/ui/#link=TOKEN`) joined to the dashboard's origin. The token rides in
 * the fragment, which browsers send to no server and put in no Referer.
 */
export const uiLinkInfo = z.object({ path: z.string(), expires_at: z.string() });
export type UiLinkInfo = z.infer<typeof uiLinkInfo>;

/**
 * What a dashboard session is: its key's tenant and scopes (the page shows only what they allow)
 * and the CSRF token every state-changing request made with the session's cookie sends as
 * `X-CSRF-Token`; both null when the caller used an API key instead of the cookie.
 */
export const uiSessionInfo = z.object({
  key_id: z.string().nullable(),
  tenant: z.string(),
  scopes: z.array(z.enum(API_SCOPES)),
  csrf_token: z.string().nullable(),
  expires_at: z.string().nullable(),
});
export type UiSessionInfo = z.infer<typeof uiSessionInfo>;
