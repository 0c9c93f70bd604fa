import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { BothyError, SNAPSHOT_ID_RE, type SandboxInfo } from "@bothy/protocol";
import { principalOf } from "../auth/auth-hooks.ts";
import type { Principal } from "../auth/key-ring.ts";
import { hasScope } from "../auth/scopes.ts";
import type { Quotas } from "../auth/quotas.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { isIn } from "../sandboxes/lifecycle.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import type { AccessTokens } from "./access-token.ts";
import { E2bHttpError, parseE2b as parse } from "./e2b-errors.ts";
import type { E2bState } from "./e2b-state.ts";
import { sampleMetrics } from "./sandbox-metrics.ts";

/**
 * The envd version this emulation claims. The SDK switches features on by it: ≥ 0.4.0 means no
 * implicit user on envd calls, 0.5.2 adds stdin close, 0.5.7 octet-stream and gzip uploads;
 * file metadata (0.6.2) and newer features are refused client-side with TemplateError until
 * bothy serves them.
 */
export const ENVD_VERSION = "0.5.7";

/** E2B's default sandbox lifetime when the create names none (bothy's own default may differ). */
const E2B_DEFAULT_TIMEOUT_S = 300;
/** E2B's template with nothing installed maps to bothy's base template; @e2b/code-interpreter's default to ours. */
const TEMPLATE_ALIASES: Record<string, string> = { base: "seed", "code-interpreter-v1": "code-interpreter" };
const MAX_PAGE = 100;

const envName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "environment names are letters, digits and _");

const createBody = z.object({
  templateID: z.string().optional(),
  timeout: z.number().int().optional(),
  metadata: z.record(z.string(), z.string()).optional(),
  envVars: z.record(envName, z.string()).optional(),
  allow_internet_access: z.boolean().optional(),
  // Accepted because every bothy sandbox is secured with an access token.
  secure: z.boolean().optional(),
  // lifecycle.onTimeout "pause": asleep at the timeout instead of killed (bothy's on_timeout sleep).
  autoPause: z.boolean().optional(),
  // Accepted: bothy's sleep keeps memory where the driver can (QEMU) and never can on gVisor.
  autoPauseMemory: z.boolean().optional(),
  // lifecycle.autoResume: traffic wakes a sandbox paused by its timeout or by pause (else only connect).
  autoResume: z.object({ enabled: z.boolean() }).optional(),
  // E2B mounts are read-write; bothy's one-writer rule applies (a second is refused).
  volumeMounts: z.array(z.object({ name: z.string(), path: z.string() })).optional(),
  // Not served, and refused rather than dropped: a sandbox made without the egress rules or the
  // identity its caller asked for would run with more reach than the caller meant it to have.
  network: z
    .undefined(
      "network is not served by bothy's E2B surface yet: use allow_internet_access (false: no egress), or bothy's own API (allow_out, deny_out, host policies)",
    )
    .optional(),
  mcp: z.undefined("mcp is not served by bothy").optional(),
  iam: z.undefined("iam is not served by bothy").optional(),
});

const timeoutBody = z.object({ timeout: z.number().int() });
const connectBody = z.object({ timeout: z.number().int().optional(), memory: z.boolean().optional() });
// QEMU always keeps memory; `memory: false` lets gVisor, which cannot, pause with its files only.
const pauseBody = z.object({ memory: z.boolean().optional() });
const metricsQuery = z.object({
  start: z.coerce.number().int().optional(),
  end: z.coerce.number().int().optional(),
});

const listQuery = z.object({
  metadata: z.string().optional(),
  // Comma-joined, or the parameter repeated.
  state: z.union([z.string(), z.array(z.string())]).optional(),
  template: z.string().optional(),
  startedAfter: z.iso.datetime({ offset: true }).optional(),
  order: z.enum(["asc", "desc"]).optional(),
  limit: z.coerce.number().int().min(1).max(MAX_PAGE).optional(),
  nextToken: z.string().optional(),
});

type Params = { Params: { id: string } };

/** bothy's states as E2B's two: dormant sandboxes read as paused (an envd call wakes them unless only connect may). */
function e2bState(info: SandboxInfo): "running" | "paused" | undefined {
  if (info.state === "running") return "running";
  if (isIn("dormant", info.state)) return "paused";
  return undefined;
}

function listedShape(info: SandboxInfo, state: "running" | "paused"): Record<string, unknown> {
  return {
    sandboxID: info.sandbox_id,
    templateID: info.template,
    clientID: "bothy",
    startedAt: info.created_at,
    endAt: info.expires_at ?? info.created_at,
    state,
    cpuCount: info.vcpu,
    memoryMB: info.memory_mib,
    diskSizeMB: info.disk_mib ?? 0,
    envdVersion: ENVD_VERSION,
    metadata: info.metadata,
  };
}

/** `metadata=k=v&k2=v2` (form-encoded, keys and values URI-encoded once more): every pair must match. */
export function metadataFilter(raw: string | undefined): (info: SandboxInfo) => boolean {
  if (raw === undefined || raw === "") return () => true;
  const wanted: [string, string][] = [];
  try {
    for (const [k, v] of new URLSearchParams(raw)) wanted.push([decodeURIComponent(k), decodeURIComponent(v)]);
  } catch (err) {
    throw new E2bHttpError(400, `metadata is not a form-encoded key=value list: ${(err as Error).message}`);
  }
  return (info) => wanted.every(([k, v]) => info.metadata[k] === v);
}

/** Paging cursor: the (created_at, sandbox_id) of the last sandbox shown, opaque to clients. */
function encodeToken(info: SandboxInfo): string {
  return Buffer.from(JSON.stringify([info.created_at, info.sandbox_id])).toString("base64url");
}

function decodeToken(token: string): [string, string] {
  const bad = new E2bHttpError(400, "nextToken is not one this server gave out");
  let value: unknown;
  try {
    value = JSON.parse(Buffer.from(token, "base64url").toString("utf8"));
  } catch {
    throw bad;
  }
  const parsed = z.tuple([z.string(), z.string()]).safeParse(value);
  if (!parsed.success) throw bad;
  return parsed.data;
}

/**
 * What create, connect and fork answer: how to reach the sandbox's envd, with tokens bound to the
 * calling key (those routes need sandboxes:write, which is what the tokens let one do).
 */
export function connectionShape(
  tokens: AccessTokens,
  domain: string | null,
): (info: SandboxInfo, principal: Principal) => Record<string, unknown> {
  return (info, principal) => ({
    sandboxID: info.sandbox_id,
    templateID: info.template,
    clientID: "bothy",
    envdVersion: ENVD_VERSION,
    envdAccessToken: tokens.tokenFor(info.sandbox_id, principal),
    trafficAccessToken: tokens.trafficTokenFor(info.sandbox_id, principal),
    domain,
  });
}

/** E2B's control plane (`/e2b/...`): each call maps onto bothy's SandboxManager. */
export function controlPlaneRoutes(
  app: FastifyInstance,
  deps: { manager: SandboxManager; ledger: LedgerStore; quotas: Quotas },
  tokens: AccessTokens,
  state: E2bState,
  /** bothy's preview domain: the SDK's `getHost(port)` then names a host bothy serves. */
  domain: string | null,
): void {
  const { manager, ledger, quotas } = deps;
  const connection = connectionShape(tokens, domain);

  /** A sandbox E2B can see: gone (deleted, failed) or still being made is E2B's 404. */
  const visible = async (id: string): Promise<SandboxInfo & { e2bState: "running" | "paused" }> => {
    const info = await manager.info(id);
    const shown = e2bState(info);
    if (!shown) throw new E2bHttpError(404, `Sandbox ${id} not found (it is ${info.state})`);
    return { ...info, e2bState: shown };
  };

  app.post("/v2/sandboxes", async (request, reply) => {
    const body = parse(createBody, request.body, "POST /v2/sandboxes");
    const principal = principalOf(request);
    const { tenant } = principal;
    const templateID = body.templateID ?? "base";
    const { sandbox } = await manager.create(
      {
        // Sandbox.create(snapshotId): a snapshot of the tenant, on its own template.
        ...(SNAPSHOT_ID_RE.test(templateID)
          ? { snapshot: templateID }
          : { template: TEMPLATE_ALIASES[templateID] ?? templateID }),
        timeout_s: body.timeout ?? E2B_DEFAULT_TIMEOUT_S,
        on_timeout: body.autoPause === true ? "sleep" : "delete",
        // E2B's default: a paused sandbox waits for Sandbox.connect.
        auto_wake: body.autoResume?.enabled ?? false,
        ...(body.metadata ? { metadata: body.metadata } : {}),
        ...(body.allow_internet_access === false ? { internet: false } : {}),
        ...(body.volumeMounts?.length
          ? { volumes: body.volumeMounts.map((m) => ({ name: m.name, path: m.path })) }
          : {}),
      },
      undefined,
      { tenant, admit: (size) => quotas.admit(tenant, size) },
    );
    await state.setEnv(sandbox.sandbox_id, body.envVars ?? {});
    return reply.code(201).send(connection(sandbox, principal));
  });

  /** Resumes a dormant sandbox (201) or joins a running one (200); the timeout only ever extends. */
  app.post<Params>("/v2/sandboxes/:id/connect", async (request, reply) => {
    const body = parse(connectBody, request.body, "POST /v2/sandboxes/{id}/connect");
    const info = await visible(request.params.id);
    if (info.e2bState !== "running") await manager.ensureRunning(info.sandbox_id, "resume");
    if (body.timeout !== undefined) {
      const current = (await manager.info(info.sandbox_id)).expires_at;
      if (current === null || Date.parse(current) < Date.now() + body.timeout * 1000)
        await manager.setTimeout(info.sandbox_id, { timeout_s: body.timeout });
    }
    return reply.code(info.e2bState === "running" ? 200 : 201).send(connection(info, principalOf(request)));
  });

  app.get("/v2/sandboxes", async (request, reply) => {
    const query = parse(listQuery, request.query, "GET /v2/sandboxes");
    const states = new Set([query.state ?? "running,paused"].flat().flatMap((s) => s.split(",")));
    const matches = metadataFilter(query.metadata);
    const template = query.template === undefined ? undefined : (TEMPLATE_ALIASES[query.template] ?? query.template);
    const startedAfter = query.startedAfter === undefined ? undefined : Date.parse(query.startedAfter);
    // Newest first with order=desc: the cursor then walks the other way.
    const sign = query.order === "desc" ? -1 : 1;
    const principal = principalOf(request);
    const mine = principal.scopes.has("admin") ? undefined : await ledger.auth.sandboxIdsOf(principal.tenant);
    const listed = (await manager.list())
      .filter((info) => mine === undefined || mine.has(info.sandbox_id))
      .map((info) => ({ info, shown: e2bState(info) }))
      .filter(
        (s): s is { info: SandboxInfo; shown: "running" | "paused" } =>
          s.shown !== undefined &&
          states.has(s.shown) &&
          matches(s.info) &&
          (template === undefined || s.info.template === template) &&
          (startedAfter === undefined || Date.parse(s.info.created_at) > startedAfter),
      )
      .sort((a, b) => sign * cursorCompare(a.info, [b.info.created_at, b.info.sandbox_id]));
    const after = query.nextToken === undefined ? undefined : decodeToken(query.nextToken);
    const rest = after ? listed.filter((s) => sign * cursorCompare(s.info, after) > 0) : listed;
    const page = rest.slice(0, query.limit ?? MAX_PAGE);
    const last = page.at(-1);
    if (last && rest.length > page.length) reply.header("x-next-token", encodeToken(last.info));
    return page.map((s) => listedShape(s.info, s.shown));
  });

  /** The envd token only for a key that may run commands: it starts processes as root. */
  app.get<Params>("/sandboxes/:id", async (request) => {
    const info = await visible(request.params.id);
    const principal = principalOf(request);
    return {
      ...listedShape(info, info.e2bState),
      ...(hasScope(principal.scopes, "sandboxes:write")
        ? { envdAccessToken: tokens.tokenFor(info.sandbox_id, principal) }
        : {}),
      domain,
      allowInternetAccess: info.network?.internet ?? false,
      lifecycle: { onTimeout: info.on_timeout === "sleep" ? "pause" : "kill", autoResume: info.auto_wake ?? true },
    };
  });

  /**
   * QEMU saves the VM's memory; gVisor cannot (bothy's 501 not_supported, as E2B's error body),
   * but pauses with its files only for `pause({keepMemory: false})`.
   */
  app.post<Params>("/sandboxes/:id/pause", async (request, reply) => {
    const body = parse(pauseBody, request.body, "POST /sandboxes/{id}/pause");
    const info = await visible(request.params.id);
    if (info.e2bState === "paused") throw new E2bHttpError(409, `Sandbox ${info.sandbox_id} is already paused`);
    await manager.pause(info.sandbox_id, body.memory === undefined ? {} : { memory: body.memory });
    return reply.code(204).send();
  });

  /** One sample taken now from inside a running sandbox; a paused one has none (it is not woken). */
  app.get<Params>("/sandboxes/:id/metrics", async (request) => {
    const { start, end } = parse(metricsQuery, request.query, "GET /sandboxes/{id}/metrics");
    const info = await visible(request.params.id);
    const now = Date.now() / 1000;
    if (info.e2bState !== "running" || (start !== undefined && start > now) || (end !== undefined && end < now - 1))
      return [];
    return [await sampleMetrics(await manager.agent(info.sandbox_id), info.vcpu)];
  });

  app.post<Params>("/sandboxes/:id/timeout", async (request, reply) => {
    const { timeout } = parse(timeoutBody, request.body, "POST /sandboxes/{id}/timeout");
    await visible(request.params.id);
    await manager.setTimeout(request.params.id, { timeout_s: timeout });
    return reply.code(204).send();
  });

  app.delete<Params>("/sandboxes/:id", async (request, reply) => {
    const info = await manager.info(request.params.id);
    // One being deleted is already gone for E2B: a second kill answers false, as once it is deleted.
    if (!isIn("active", info.state))
      throw new BothyError("sandbox_not_found", `Sandbox ${info.sandbox_id} was already ${info.state}.`);
    await manager.delete(request.params.id);
    return reply.code(204).send();
  });
}

function cursorCompare(info: SandboxInfo, [createdAt, id]: [string, string]): number {
  if (info.created_at !== createdAt) return info.created_at < createdAt ? -1 : 1;
  return info.sandbox_id < id ? -1 : info.sandbox_id > id ? 1 : 0;
}
