import {
  request as httpRequest,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type OutgoingHttpHeaders,
} from "node:http";
import type { Socket } from "node:net";
import type { Duplex } from "node:stream";
import type { FastifyInstance, FastifyReply, FastifyRequest, FastifySchema } from "fastify";
import { BothyError, linkRequest, linkResponse, portList, SANDBOX_ID_RE, toProblem } from "@bothy/protocol";
import { principalOf } from "../auth/auth-hooks.ts";
import { NO_AUTH_PRINCIPAL } from "../auth/key-ring.ts";
import { LINK_COOKIE, linkedByCookie, type LinkTokens, tokenInQuery, withoutToken } from "../auth/link-tokens.ts";
import { relayBody } from "./body-relay.ts";
import { absoluteUrl } from "./desktop-routes.ts";
import { parseInput } from "./parse-input.ts";
import { type PortForm, toClient, toGuest } from "./port-headers.ts";
import { refuseCrossOrigin } from "./port-origin.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import type { PortDialer, Upstream } from "./port-dialer.ts";
import type { RelayMeter } from "./relay-meter.ts";
import { json, media } from "./route-schema.ts";

const tags = ["ports"];
const listDoc = {
  tags,
  summary: "List the TCP ports listening inside the sandbox",
  response: { 200: json(portList, "Listening sockets") },
};
const linkDoc = {
  tags,
  summary:
    "A signed link that opens the port in a browser without an API key until it expires (ttl_s, default 3600, max 86400): its first GET moves the token into an HttpOnly cookie for that port",
  body: linkRequest,
  response: { 200: json(linkResponse, "The link (and its preview host form with BOTHY_PREVIEW_DOMAIN)") },
};
const proxyDoc: FastifySchema = {
  tags,
  summary:
    "Proxied to 127.0.0.1:{port} inside the sandbox (HTTP and WebSocket upgrades; 502 port_not_listening when nothing listens). Answers on the API's origin carry a CSP sandbox without allow-same-origin; a request let in by a link's cookie whose Origin is another origin gets 403 origin_refused",
  response: { 200: media("*/*", "Whatever the server inside answers") },
};

type PortParams = { Params: { id: string; port: string; "*"?: string } };

/** The methods the proxy passes on (HEAD separately: Fastify's own HEAD would run GET's handler). */
export const PROXIED_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] as const;
export const PROXY_URLS = ["/sandboxes/:id/ports/:port", "/sandboxes/:id/ports/:port/*"] as const;

/** Hop-by-hop headers (RFC 9110 7.6.1): they describe one connection and are never passed on. */
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authenticate",
  "proxy-authorization",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
]);

/** Requests that came by a preview host name (or E2B's port header): the app is at the root of their origin. */
const viaPreviewHost = new WeakSet<IncomingMessage>();
/** Requests that came by a preview host name: their answers are shown on an origin of the app's own. */
const onOwnOrigin = new WeakSet<IncomingMessage>();

/** Where the answer to a proxied request is shown: anything not on a preview host is on the API's origin. */
function formOf(req: IncomingMessage): PortForm {
  return onOwnOrigin.has(req) ? "preview" : "path";
}

/** Marks a request a URL rewrite sent to the proxy as one whose app sees no path prefix. */
export function servedAtRoot(req: IncomingMessage): void {
  viaPreviewHost.add(req);
}

/**
 * For Fastify's `rewriteUrl`, which runs before routing (WebSocket upgrades included): a request
 * whose Host is `{port}-{sandbox id}.<domain>` is routed as `/sandboxes/{id}/ports/{port}{url}`,
 * so the same hooks, checks and proxy serve it. Any other Host is left alone.
 */
export function previewHostRewrite(domain: string): (req: IncomingMessage) => string {
  const suffix = `.${domain}`;
  return (req) => {
    const url = req.url ?? "/";
    const host = (req.headers.host ?? "").toLowerCase().replace(/:\d+$/, "");
    if (!host.endsWith(suffix)) return url;
    const match = /^([0-9]{1,5})-(sbx_[a-z2-7]{20})$/.exec(host.slice(0, -suffix.length));
    if (!match) return url;
    viaPreviewHost.add(req);
    onOwnOrigin.add(req);
    return `/sandboxes/${match[2]}/ports/${match[1]}${url.startsWith("/") ? url : `/${url}`}`;
  };
}

/** The part of the request URL after `/sandboxes/ID/ports/PORT`, as the client sent it. */
const TARGET_RE = /^\/sandboxes\/[^/?]+\/ports\/[^/?]+(.*)$/s;

function parsePort(raw: string): number {
  const port = /^[0-9]{1,5}$/.test(raw) ? Number(raw) : NaN;
  if (!(port >= 1 && port <= 65535))
    throw new BothyError("invalid_request", `"${raw.slice(0, 16)}" is not a TCP port; use a number from 1 to 65535.`);
  return port;
}

/** Headers without hop-by-hop ones, nor any the Connection header names. */
export function endToEnd(headers: IncomingHttpHeaders): OutgoingHttpHeaders {
  const named = new Set(
    String(headers["connection"] ?? "")
      .split(",")
      .map((h) => h.trim().toLowerCase())
      .filter(Boolean),
  );
  const out: OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(headers))
    if (value !== undefined && !HOP_BY_HOP.has(name) && !named.has(name)) out[name] = value;
  return out;
}

/** Raw header lines of a response, for writing it onto a socket ourselves. */
function headBlock(res: IncomingMessage, headers: OutgoingHttpHeaders): string {
  const lines = [`HTTP/1.1 ${res.statusCode ?? 502} ${res.statusMessage ?? ""}`];
  for (const [name, value] of Object.entries(headers))
    for (const v of [value].flat()) if (v !== undefined) lines.push(`${name}: ${String(v)}`);
  return `${lines.join("\r\n")}\r\n\r\n`;
}

/** The `head` bytes @fastify/websocket kept from the upgrade event (what the client sent past its headers). */
function upgradeHead(request: FastifyRequest): Buffer {
  const raw = request.raw as unknown as Record<symbol, unknown>;
  const key = Object.getOwnPropertySymbols(raw).find((s) => s.description === "ws-head");
  const head = key === undefined ? undefined : raw[key];
  return Buffer.isBuffer(head) ? head : Buffer.alloc(0);
}

/**
 * Ports as URLs: `GET /sandboxes/:id/ports` lists the sandbox's listening TCP sockets, and HTTP or
 * WebSocket to `/sandboxes/:id/ports/:port/...` reaches that port inside it: over the sandbox's own
 * network where it has one, else over the guest channel to `127.0.0.1:port` (port-dialer.ts).
 * Bodies stream both ways under TCP's or the guest protocol's windows; a client that goes away
 * resets the connection inside the sandbox.
 */
export async function portRoutes(
  app: FastifyInstance,
  manager: SandboxManager,
  /** `secureCookies`: the client side is HTTPS (TLS here, or a TLS proxy in front), whatever this hop is. */
  links: { tokens: LinkTokens; previewDomain: string | undefined; secureCookies: boolean },
  relays: RelayMeter,
  dialer: PortDialer,
): Promise<void> {
  app.get<{ Params: { id: string } }>("/sandboxes/:id/ports", { schema: listDoc }, async (request) => ({
    ports: await (await manager.agent(request.params.id)).listPorts(),
  }));

  // A link a person opens in a browser, no API key needed (link-tokens.ts). Not under
  // /ports/:port/, which is all the app's own.
  app.post<{ Params: { id: string; port: string } }>(
    "/sandboxes/:id/port-links/:port",
    { schema: linkDoc },
    async (request) => {
      const { id } = request.params;
      if (!SANDBOX_ID_RE.test(id))
        throw new BothyError("invalid_sandbox_id", `"${id.slice(0, 64)}" is not a sandbox id.`);
      const port = parsePort(request.params.port);
      const body = parseInput(linkRequest, request.body ?? {}, "POST /port-links");
      if (body.control !== undefined)
        throw new BothyError(
          "invalid_request",
          "control is for desktop links; a port link opens the port for HTTP and WebSockets.",
        );
      await manager.info(id);
      const exp = Math.floor(Date.now() / 1000) + body.ttl_s;
      const token = links.tokens.sign({ sid: id, what: `port:${port}`, exp }, principalOf(request));
      const hostPort = /:\d+$/.exec(request.headers.host ?? "")?.[0] ?? "";
      return {
        url: absoluteUrl(request, `/sandboxes/${id}/ports/${port}/?token=${token}`),
        ...(links.previewDomain === undefined
          ? {}
          : {
              preview_url: absoluteUrl(request, `/?token=${token}`, `${port}-${id}.${links.previewDomain}${hostPort}`),
            }),
        expires_at: new Date(exp * 1000).toISOString(),
      };
    },
  );

  await app.register(async (scope) => {
    // Bodies of any type pass through unparsed: the route streams the raw request on.
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser("*", (_request, payload, done) => done(null, payload));

    for (const url of PROXY_URLS)
      scope.route<PortParams>({
        method: [...PROXIED_METHODS],
        url,
        schema: proxyDoc,
        exposeHeadRoute: false,
        config: { relaysUpgrade: true },
        // Runs before @fastify/websocket's handler, which would answer an upgrade itself.
        preHandler: async (request, reply) => {
          // The link cookie (or nothing, on a server without keys) is what a browser sends by itself:
          // such a request must come from a page of the port's own origin to act.
          refuseCrossOrigin(request, linkedByCookie(request.raw) || request.principal === NO_AUTH_PRINCIPAL);
          if (!request.ws && tokenInQuery(request.raw) && (request.method === "GET" || request.method === "HEAD"))
            return linkLanding(request, reply, links.secureCookies);
          if (request.ws) await relayUpgrade(request, reply, await connect(dialer, request), relays);
        },
        handler: async (request, reply) => proxyHttp(request, reply, dialer),
      });
  });
}

/** The answer when nothing listens on the port (either path's refusal). */
function notListening(request: FastifyRequest<PortParams>, port: number): (err: unknown) => never {
  const { id } = request.params;
  return (err) => {
    if (err instanceof BothyError && err.code === "port_not_listening")
      throw new BothyError(
        "port_not_listening",
        `Nothing listens on port ${port} inside sandbox ${id}. Start a server there on 127.0.0.1 or 0.0.0.0 port ${port} (GET /sandboxes/${id}/ports lists the ports that are listening), then retry.`,
        { cause: err },
      );
    throw err;
  };
}

async function connect(dialer: PortDialer, request: FastifyRequest<PortParams>): Promise<Duplex> {
  const port = parsePort(request.params.port);
  return dialer.open(request.params.id, port).catch(notListening(request, port));
}

/** The first GET of a port link: the token moves from the URL into a cookie for this port, and the browser comes back without it. */
function linkLanding(request: FastifyRequest<PortParams>, reply: FastifyReply, secure: boolean): FastifyReply {
  const { token, exp } = tokenInQuery(request.raw) ?? { token: "", exp: 0 };
  const path = viaPreviewHost.has(request.raw) ? "/" : `/sandboxes/${request.params.id}/ports/${request.params.port}`;
  const cookie = [
    `${LINK_COOKIE}=${token}`,
    `Path=${path}`,
    `Max-Age=${Math.max(0, exp - Math.floor(Date.now() / 1000))}`,
    "HttpOnly",
    "SameSite=Lax",
    ...(secure || request.protocol === "https" ? ["Secure"] : []),
  ].join("; ");
  return reply
    .code(303)
    .header("set-cookie", cookie)
    .header("cache-control", "no-store")
    .header("referrer-policy", "no-referrer")
    .header("location", withoutToken(request.originalUrl))
    .send();
}

function target(request: FastifyRequest): string {
  const raw = request.raw.url ?? "";
  const rest = TARGET_RE.exec(tokenInQuery(request.raw) ? withoutToken(raw) : raw)?.[1] ?? "";
  return rest.startsWith("/") ? rest : `/${rest}`;
}

function forwardedHeaders(request: FastifyRequest<PortParams>): OutgoingHttpHeaders {
  const port = request.params.port;
  return {
    // Development servers check Host; inside the sandbox the app is on localhost.
    host: `localhost:${port}`,
    "x-forwarded-host": request.headers.host ?? "",
    "x-forwarded-proto": "http",
    ...(viaPreviewHost.has(request.raw)
      ? {}
      : { "x-forwarded-prefix": `/sandboxes/${request.params.id}/ports/${port}` }),
  };
}

/**
 * Requests that carry no body and may be sent twice (RFC 9110 9.2.2): the only ones sent again when
 * a kept-alive connection turns out closed before any answer came.
 */
function retriable(request: FastifyRequest): boolean {
  return (
    ["GET", "HEAD", "OPTIONS"].includes(request.method) &&
    request.headers["content-length"] === undefined &&
    request.headers["transfer-encoding"] === undefined
  );
}

/**
 * One HTTP exchange, streamed both ways: over a pooled connection where the sandbox has a network
 * (port-pool.ts), else over a channel stream of its own.
 */
async function proxyHttp(request: FastifyRequest<PortParams>, reply: FastifyReply, dialer: PortDialer): Promise<void> {
  const port = parsePort(request.params.port);
  const upstream = await dialer.upstream(request.params.id, port).catch(notListening(request, port));
  reply.hijack();
  const res = reply.raw;
  const headers = { ...toGuest(endToEnd(request.headers)), ...forwardedHeaders(request) };
  const path = target(request);
  // A kept-alive socket the app closed while it was idle fails before any answer: such a request
  // is sent once more on a new connection when that is safe (retriable); any other gets the 502.
  const send = (via: Upstream, again: boolean): void => {
    if (res.destroyed) {
      // The client went away while a retry dialed: nothing is asked of the sandbox.
      if ("tunnel" in via) via.tunnel.destroy();
      else via.dialed?.destroy();
      return;
    }
    const to = "tunnel" in via ? undefined : via.pool.requestOptions(via.dialed);
    const outgoing = httpRequest({
      method: request.method,
      path,
      headers,
      ...(to === undefined
        ? { createConnection: () => (via as { tunnel: Duplex }).tunnel as unknown as Socket }
        : to.options),
    });
    // The agent took an idle socket after all: the one dialed for this request is not needed.
    if (to?.unused() === true && "dialed" in via) via.dialed?.destroy();
    let answer: IncomingMessage | undefined;
    const teardown = (): void => {
      // A response read whole has given its socket back to the pool; anything less closes it.
      if (answer?.complete !== true) outgoing.destroy();
      if ("tunnel" in via) via.tunnel.destroy();
    };
    // The response is over (sent, or its client gone): nothing may stay open inside the sandbox
    // but an idle connection of the pool.
    res.once("close", teardown);
    outgoing.on("response", (got) => {
      answer = got;
      res.writeHead(
        answer.statusCode ?? 502,
        answer.statusMessage,
        toClient(endToEnd(answer.headers), formOf(request.raw)),
      );
      // Each chunk goes out as it comes, so a streamed response arrives as it is made.
      relayBody(got, res);
    });
    outgoing.on("error", (err) => {
      if (res.headersSent) {
        res.destroy();
        return;
      }
      if (answer === undefined && !again && outgoing.reusedSocket && retriable(request)) {
        res.removeListener("close", teardown);
        dialer.upstream(request.params.id, port, true).then(
          (fresh) => send(fresh, true),
          (why: unknown) => fail(why instanceof Error ? why : new Error(String(why))),
        );
        return;
      }
      fail(err);
    });
    if (retriable(request)) outgoing.end();
    else relayBody(request.raw, outgoing);
  };
  const fail = (err: Error): void => {
    if (res.headersSent || res.destroyed) {
      res.destroy();
      return;
    }
    const problem = new BothyError(
      "port_not_listening",
      `The server on port ${request.params.port} inside sandbox ${request.params.id} closed the connection without an HTTP answer (${err.message}).`,
    );
    res.writeHead(problem.status, { "content-type": "application/problem+json" });
    res.end(JSON.stringify(toProblem(problem, request.url.split("?")[0])));
  };
  send(upstream, false);
}

/**
 * A WebSocket (or any Upgrade) request: sent on into the sandbox; on its 101 the two sockets are
 * joined byte for byte; any other answer is passed back and the connection closed.
 */
async function relayUpgrade(
  request: FastifyRequest<PortParams>,
  reply: FastifyReply,
  tunnel: Duplex,
  relays: RelayMeter,
): Promise<void> {
  reply.hijack();
  const client = request.raw.socket as Duplex;
  // Each direction is piped, so each pauses its source while the other side is full: a port
  // that never reads leaves the client paused with a bounded amount held here.
  const untrack = relays.track({
    heldBytes: () => tunnel.writableLength + client.readableLength,
    paused: () => client.isPaused(),
    close: () => teardown(),
  });
  const clientHead = upgradeHead(request);
  const upstream = httpRequest({
    method: request.method,
    path: target(request),
    headers: {
      ...toGuest(endToEnd(request.headers)),
      connection: "Upgrade",
      upgrade: request.headers.upgrade ?? "websocket",
      ...forwardedHeaders(request),
    },
    createConnection: () => tunnel as unknown as Socket,
  });
  const teardown = (): void => {
    untrack();
    upstream.destroy();
    tunnel.destroy();
    client.destroy();
  };
  client.once("close", teardown);
  client.on("error", teardown);
  upstream.on("error", teardown);
  upstream.on("upgrade", (answer, joined, head) => {
    const headers = {
      ...toClient(endToEnd(answer.headers), formOf(request.raw)),
      connection: "Upgrade",
      upgrade: answer.headers.upgrade ?? "",
    };
    client.write(headBlock(answer, headers));
    if (head.length > 0) client.write(head);
    if (clientHead.length > 0) joined.write(clientHead);
    joined.on("error", teardown);
    joined.once("close", teardown);
    joined.pipe(client);
    client.pipe(joined);
  });
  upstream.on("response", (answer) => {
    client.write(
      headBlock(answer, { ...toClient(endToEnd(answer.headers), formOf(request.raw)), connection: "close" }),
    );
    answer.pipe(client);
    answer.once("error", teardown);
  });
  upstream.end();
}
