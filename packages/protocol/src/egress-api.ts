/**
 * The egress gateway's bodies: host rules (per sandbox and per tenant), the secrets vault and
 * approvals. Every sandbox's TCP 80/443 under a host policy passes the gateway on the host, which
 * decides by these rules; secrets are swapped in there, so their values never enter a sandbox.
 */
import { z } from "zod";

export const EGRESS_ACTIONS = ["allow", "deny", "ask"] as const;
export const egressAction = z.enum(EGRESS_ACTIONS);
export type EgressAction = z.infer<typeof egressAction>;

export const MAX_HOST_RULES = 128;

const LABEL = "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?";
/** `api.github.com` (that name only) or `*.github.com` (any name below it, not `github.com` itself). */
export const HOST_PATTERN_RE = new RegExp(`^(\\*\\.)?(${LABEL}\\.)*${LABEL}$`);
export const hostPattern = z
  .string()
  .max(253)
  .transform((s) => s.toLowerCase().replace(/\.$/, ""))
  .pipe(z.string().regex(HOST_PATTERN_RE, "a host name (api.github.com) or a pattern (*.github.com)"));

/**
 * One rule: the first whose host, method and path match a request decides it. Methods and paths
 * can only be seen on plain HTTP and on HTTPS the gateway terminates (hosts a secret is bound to,
 * or named by a rule with methods or a path); for other HTTPS a rule with them matches no request.
 */
export const hostRule = z.strictObject({
  host: hostPattern,
  /** Upper-case methods (`POST`); omitted: every method. */
  methods: z
    .array(z.string().regex(/^[A-Z]{1,16}$/, "an upper-case HTTP method"))
    .min(1)
    .max(16)
    .optional(),
  /** A path prefix (`/repos/`); a `*` matches any characters but `/`. Omitted: every path. */
  path: z.string().startsWith("/", "a path starts with /").max(1024).optional(),
  action: egressAction,
});
export type HostRule = z.infer<typeof hostRule>;

/** Tools of the agent (MCP and /tools) whose calls a policy can deny or hold for approval. */
export const toolRules = z.record(z.string().regex(/^[a-z][a-z0-9_]{0,63}$/, "a tool name"), egressAction);

/**
 * A host policy as asked for, per sandbox (`policy` on create) or as a tenant's default
 * (`PUT /policy`). Order of evaluation: `rules` in order, then `deny_hosts`, then `allow_hosts`,
 * then `default`. `default` omitted: `deny` when `allow_hosts` or an `allow` rule is given, else
 * `allow`.
 */
export const hostPolicyRequest = z.strictObject({
  allow_hosts: z.array(hostPattern).max(MAX_HOST_RULES).optional(),
  deny_hosts: z.array(hostPattern).max(MAX_HOST_RULES).optional(),
  rules: z.array(hostRule).max(MAX_HOST_RULES).optional(),
  default: egressAction.optional(),
  tools: toolRules.optional(),
});
export type HostPolicyRequest = z.input<typeof hostPolicyRequest>;

/** `GET|PUT|DELETE /policy`: a tenant's default host policy; null when it has none. */
export const tenantPolicyInfo = z.object({ tenant: z.string(), policy: hostPolicyRequest.nullable() });
export type TenantPolicyInfo = z.infer<typeof tenantPolicyInfo>;

/**
 * The policy the gateway applies to one sandbox: the tenant's rules first (a sandbox cannot
 * override its tenant's), then the sandbox's; `default` from the sandbox, else the tenant, else
 * `allow`. `source` and `index` name the rule in denials, events and approvals (`tenant#2`).
 */
export const effectiveHostPolicy = z.object({
  rules: z.array(hostRule.extend({ source: z.enum(["tenant", "sandbox"]), index: z.number().int() })),
  default: egressAction,
  tools: z.record(z.string(), egressAction),
  /** Names of the vault's secrets bound to this sandbox (never their values). */
  secrets: z.array(z.string()),
});
export type EffectiveHostPolicy = z.infer<typeof effectiveHostPolicy>;

// ---- secrets vault ----------------------------------------------------------------------------------

/** Lower-case letters, digits and `_`; the sandbox's variable is its upper-case form (`github` → `GITHUB`). */
export const SECRET_NAME_RE = /^[a-z][a-z0-9_]{0,62}$/;
export const secretName = z.string().regex(SECRET_NAME_RE, "a secret name: lower-case letters, digits and _");
export const MAX_SANDBOX_SECRETS = 32;
/** The prefix of the stand-in a sandbox sees in place of a secret's value. */
export const PLACEHOLDER_PREFIX = "bothy_ph_";

export const putSecretRequest = z.strictObject({
  value: z
    .string()
    .min(1)
    .max(64 * 1024),
  /** The only hosts (exact or `*.` patterns) the value is ever sent to. */
  hosts: z.array(hostPattern).min(1).max(32),
  /** Set this header on every request to those hosts; omitted: the placeholder is swapped wherever the sandbox puts it in a header. */
  inject: z
    .strictObject({
      header: z.string().regex(/^[A-Za-z0-9-]{1,64}$/, "a header name"),
      format: z.string().includes("{value}", { message: "format must contain {value}" }).max(256).default("{value}"),
    })
    .optional(),
});
export type PutSecretRequest = z.input<typeof putSecretRequest>;

/** A secret as every route shows it: never its value. */
export const secretInfo = z.object({
  name: z.string(),
  tenant: z.string(),
  hosts: z.array(z.string()),
  inject: z.object({ header: z.string(), format: z.string() }).nullable(),
  created_at: z.string(),
  updated_at: z.string(),
});
export type SecretInfo = z.infer<typeof secretInfo>;
export const secretList = z.object({ secrets: z.array(secretInfo) });

// ---- approvals --------------------------------------------------------------------------------------

export const APPROVAL_ID_RE = /^apr_[a-z2-7]{20}$/;
export const APPROVAL_STATES = ["pending", "approved", "denied", "expired", "cancelled"] as const;
export const approvalState = z.enum(APPROVAL_STATES);
export type ApprovalState = z.infer<typeof approvalState>;

export const approvalInfo = z.object({
  approval_id: z.string(),
  tenant: z.string(),
  sandbox_id: z.string(),
  conversation_id: z.string().nullable(),
  /** `http`: a held request through the gateway; `tool`: an agent tool's call. */
  kind: z.enum(["http", "tool"]),
  method: z.string().nullable(),
  host: z.string().nullable(),
  path: z.string().nullable(),
  tool: z.string().nullable(),
  /** Up to 8 KiB of the request body (or the tool's arguments), secret values masked. */
  excerpt: z.string(),
  /** The rule that asked (`tenant#0`, `sandbox#2`, `default`). */
  rule: z.string(),
  state: approvalState,
  created_at: z.string(),
  expires_at: z.string(),
  decided_at: z.string().nullable(),
  /** The key that decided, by id; null when it expired or was cancelled. */
  decided_by: z.string().nullable(),
  grant: z.object({ kind: z.enum(["once", "host"]), until: z.string().nullable() }).nullable(),
  reason: z.string().nullable(),
});
export type ApprovalInfo = z.infer<typeof approvalInfo>;
export const approvalList = z.object({ approvals: z.array(approvalInfo) });

/** `POST /approvals/{id}/approve` (and `/deny`, where only `reason` applies). */
export const decideApprovalRequest = z.strictObject({
  /** `once`: this request only; `host`: this request and the sandbox's requests to the same host for `minutes`. */
  grant: z.enum(["once", "host"]).default("once"),
  minutes: z.number().int().min(1).max(1440).optional(),
  reason: z.string().max(500).optional(),
});
export type DecideApprovalRequest = z.input<typeof decideApprovalRequest>;

/** `GET /approvals`: newest first, a tenant's own (an admin key's: every tenant's). */
export const approvalListQuery = z.strictObject({
  state: approvalState.optional(),
  sandbox_id: z
    .string()
    .regex(/^sbx_[a-z2-7]{20}$/, "a sandbox id (sbx_ and 20 letters and digits)")
    .optional(),
  limit: z.coerce.number().int().min(1).max(1000).default(200),
});
export type ApprovalListQuery = z.input<typeof approvalListQuery>;

/** Why an approval was cancelled: its client went away, the server stopped, or it restarted while it was pending. */
export const APPROVAL_CANCEL_REASONS = ["client_gone", "server_stopping", "server_restarted"] as const;
export type ApprovalCancelReason = (typeof APPROVAL_CANCEL_REASONS)[number];
