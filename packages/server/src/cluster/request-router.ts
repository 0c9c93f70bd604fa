import type { IncomingMessage } from "node:http";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { BothyError, SANDBOX_ID_RE, SNAPSHOT_ID_RE } from "@bothy/protocol";
import type { LedgerStore } from "../ledger/store.ts";
import { FORWARDED_HEADER, type ClusterSecret } from "./cluster-secret.ts";
import { forwardHttp, relayAnswer, type ForwardTarget } from "./forward-http.ts";
import { forwardUpgrade } from "./forward-upgrade.ts";
import { place, type PlacementNeed } from "./placement.ts";

/** Routes about one sandbox, by Fastify's route URL: their `:id` names it. */
const SANDBOX_ROUTE = /^(\/e2b(\/v2)?)?\/sandboxes\/:id(\/|$)|^\/e2b\/desktop-stream\/:id\//;
/** E2B's envd surface names its sandbox in a header, as E2B's SDKs send it. */
const ENVD_ROUTE = /^\/e2b\/envd(\/|$)/;
/** The creates a node places (a create from a snapshot stays where it is asked: snapshots are on a node's disk). */
const CREATE_ROUTES = new Set(["/sandboxes", "/e2b/v2/sandboxes"]);
/** E2B's template names that are bothy's under another name (e2b/control-plane.ts answers them the same way). */
const E2B_TEMPLATES: Record<string, string> = { base: "seed", "code-interpreter-v1": "code-interpreter" };

function header(request: FastifyRequest, name: string): string | undefined {
  const value = request.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/** The sandbox a request is about, if it is about one. */
function sandboxOf(request: FastifyRequest): string | undefined {
  const url = request.routeOptions.url;
  if (url === undefined) return undefined;
  const id = SANDBOX_ROUTE.test(url)
    ? (request.params as { id?: unknown } | undefined)?.id
    : ENVD_ROUTE.test(url)
      ? header(request, "e2b-sandbox-id")
      : undefined;
  return typeof id === "string" && SANDBOX_ID_RE.test(id) ? id : undefined;
}

/** The bytes @fastify/websocket kept with an upgrade (sent by the client after its head; almost always none). */
function upgradeHead(req: IncomingMessage): Buffer {
  const symbol = Object.getOwnPropertySymbols(req).find((s) => s.description === "ws-head");
  const head = symbol === undefined ? undefined : (req as unknown as Record<symbol, unknown>)[symbol];
  return Buffer.isBuffer(head) ? head : Buffer.alloc(0);
}

/** What a create body asks of its node, as far as placement weighs it; undefined: not placed (a snapshot's). */
function needOf(url: string, body: unknown, key: string | undefined): PlacementNeed | undefined {
  const b = (typeof body === "object" && body !== null ? body : {}) as Record<string, unknown>;
  const num = (v: unknown, otherwise: number): number => (typeof v === "number" && v > 0 ? v : otherwise);
  if (url === "/e2b/v2/sandboxes") {
    const id = typeof b["templateID"] === "string" ? b["templateID"] : "base";
    if (SNAPSHOT_ID_RE.test(id)) return undefined;
    return { driver: undefined, template: E2B_TEMPLATES[id] ?? id, vcpu: 1, memoryMib: 512, key };
  }
  if (b["snapshot"] !== undefined) return undefined;
  return {
    driver: typeof b["driver"] === "string" ? b["driver"] : undefined,
    template: typeof b["template"] === "string" ? b["template"] : "seed",
    vcpu: num(b["vcpu"], 1),
    memoryMib: num(b["memory_mib"], 512),
    key,
  };
}

/**
 * Any node answers any request (issue #28 item 4): one about a sandbox another live node runs is
 * forwarded there, signed with the cluster's secret, and the owner's answer passed back unchanged;
 * a create is placed on the node placement chooses (cluster/placement.ts) and forwarded there
 * unless that is this one. Forwarding comes before authentication: the caller's credentials go
 * with the request and the owner checks them as if called directly (its answer to another tenant's
 * sandbox is the same 404 as to an unknown one). A request that claims to be forwarded is answered
 * here only if its signature verifies (cluster-secret.ts); one that does not is refused.
 */
export class RequestRouter {
  /** Requests another node forwarded here: answered here, never sent on again nor placed. */
  private readonly forwarded = new WeakSet<IncomingMessage>();

  constructor(
    private readonly nodeId: string,
    private readonly secret: ClusterSecret,
    private readonly store: LedgerStore,
  ) {}

  /** onRequest: a forwarded request's signature, or the forwarding of one about another node's sandbox. */
  async onRequest(request: FastifyRequest, reply: FastifyReply): Promise<void> {
    const claimed = header(request, FORWARDED_HEADER);
    if (claimed !== undefined) {
      const check = this.secret.verify(claimed, request.method, request.originalUrl);
      if (!check.ok)
        throw new BothyError(
          "forward_refused",
          `This request says another node of the cluster forwarded it (${FORWARDED_HEADER}), but ${check.why}. Clients send requests without that header; nodes sign it with the cluster secret (BOTHY_CLUSTER_SECRET_FILE, the same file on every node).`,
        );
      this.forwarded.add(request.raw);
      return;
    }
    const id = sandboxOf(request);
    if (id === undefined) return;
    const home = await this.store.placement.homeOf(id);
    // This node's, a single machine's row, or a lapsed node's (shown stopped, answered here).
    if (!home || home.node_id === this.nodeId || home.lapsed) return;
    await this.forward(request, reply, { nodeId: home.node_id, url: home.url });
  }

  /** preHandler: a create goes to the node placement chooses, the body as this node read it. */
  async onCreate(request: FastifyRequest, reply: FastifyReply): Promise<void> {
    const url = request.routeOptions.url;
    if (request.method !== "POST" || url === undefined || !CREATE_ROUTES.has(url)) return;
    if (this.forwarded.has(request.raw)) return;
    const need = needOf(url, request.body, header(request, "idempotency-key"));
    if (need === undefined) return;
    const chosen = place(await this.store.placement.nodeLoads(), need);
    if (chosen === undefined || chosen.id === this.nodeId) return;
    const body = request.body === undefined ? Buffer.alloc(0) : Buffer.from(JSON.stringify(request.body));
    await this.forward(request, reply, { nodeId: chosen.id, url: chosen.url }, body);
  }

  private async forward(
    request: FastifyRequest,
    reply: FastifyReply,
    target: ForwardTarget,
    body?: Buffer,
  ): Promise<void> {
    const path = request.originalUrl;
    const signature = this.secret.sign(this.nodeId, request.method, path);
    if (request.ws) {
      await forwardUpgrade(request.raw, request.raw.socket, upgradeHead(request.raw), path, target, signature);
      reply.hijack();
      return;
    }
    const answer = await forwardHttp(request.raw, reply.raw, path, target, signature, body);
    reply.hijack();
    relayAnswer(answer, reply.raw);
  }
}

/**
 * Adds the router's hooks: forwarding on request, before authentication (registered before it);
 * placement before the create's handler, once its body is read.
 */
export function routeAcrossNodes(app: FastifyInstance, router: RequestRouter): void {
  app.addHook("onRequest", (request, reply) => router.onRequest(request, reply));
  app.addHook("preHandler", (request, reply) => router.onCreate(request, reply));
}
