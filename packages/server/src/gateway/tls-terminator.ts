/**
 * Terminates a sandbox's TLS to a host one of its secrets is bound to (or that its policy needs to
 * see requests of), so the gateway can read each request: it answers the sandbox with a leaf for
 * the host signed by bothy's egress CA (HTTP/2 or HTTP/1.1 by ALPN; WebSocket upgrades too, but
 * not to a host a secret is bound to), and sends each request on over a TLS connection of its own
 * to the address the proxy checked, with the host's name for SNI and certificate verification,
 * its body framed by the gateway (request-framing.ts).
 *
 * Per request: a placeholder of a secret not bound to this host, anywhere in the request, refuses
 * it (403, reported by name); placeholders of bound secrets become their values in headers, and
 * `inject` headers are set; responses are asked for uncompressed (accept-encoding: identity), and
 * one compressed anyway is decoded (response-decode.ts), so every echoed value (secret-scrub.ts
 * `echoNeedles`: raw, inside base64, URL- or JSON-encoded) is replaced by its placeholder on the
 * way, also when it spans chunks. Values are opened per request and appear in no log, event or error.
 */
import http, { type IncomingHttpHeaders, type IncomingMessage, type OutgoingHttpHeaders } from "node:http";
import http2, { type Http2ServerRequest, type Http2ServerResponse } from "node:http2";
import https from "node:https";
import type { Duplex, Readable } from "node:stream";
import { BothyError, toProblem } from "@bothy/protocol";
import type { LeafIssuer, SecretBinding, SecretSource, Terminate, TerminateContext } from "./contracts.ts";
import { echoNeedles, scrubStream, scrubText, StreamMatcher, type Needle } from "./secret-scrub.ts";
import { placeholdersIn, splitByHost, swapHeaders, type Headers } from "./secret-swap.ts";
import {
  closingAnswer,
  FramedBody,
  framedHeaders,
  FramingError,
  parseErrorAnswer,
  requestFraming,
} from "./request-framing.ts";
import { decodedResponse, isBodyless } from "./response-decode.ts";
import { peekBody } from "./body-excerpt.ts";

/** What the terminator reports about secrets: names only, never values. */
export interface SecretReport {
  kind: "secret_refused" | "secret_injected";
  secret: string;
  host: string;
  method: string;
  path: string;
}

export type Verdict = "allow" | { status: number; body: string | object };

export interface TerminateOptions {
  /**
   * The sandbox's connection, paused (no 'data' listener left on it); everything read from it so
   * far is `peeked` (the ClientHello), which is put back before the handshake reads it.
   */
  socket: Duplex;
  peeked: Buffer;
  /** The SNI host name: the leaf's name, the upstream's SNI and the name its certificate must carry. */
  host: string;
  /** The upstream's port. */
  port?: number;
  tenant: string;
  bindings: SecretBinding[];
  secrets: SecretSource;
  leaves: LeafIssuer;
  /** The upstream address the proxy resolved and checked; called once, on the first request. */
  dial(): Promise<string>;
  /**
   * The policy's word on one request; held while an approval is pending; `signal` aborts when the
   * client goes; `excerpt` reads the body's first bytes (for an approval) and keeps them for upstream.
   */
  decide(method: string, path: string, signal: AbortSignal, excerpt?: () => Promise<Buffer>): Promise<Verdict>;
  report?(ev: SecretReport): void;
  /** Trust for the upstream's certificate instead of Node's (tests' own CA). */
  upstreamCa?: string;
}

/** What an approval shows of a request's body, as on plain HTTP. */
const EXCERPT_BYTES = 8 * 1024;

const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
  "http2-settings",
]);

type AnyRequest = IncomingMessage | Http2ServerRequest;
type AnyResponse = http.ServerResponse | Http2ServerResponse;

/** One terminated client connection. */
class Connection {
  readonly bound: SecretBinding[];
  readonly unbound: SecretBinding[];
  readonly agent = new https.Agent({ keepAlive: true, maxSockets: 32 });
  private address: Promise<string> | undefined;

  constructor(readonly o: TerminateOptions) {
    ({ bound: this.bound, unbound: this.unbound } = splitByHost(o.host, o.bindings));
  }

  upstreamAddress(): Promise<string> {
    return (this.address ??= this.o.dial());
  }

  report(kind: SecretReport["kind"], secrets: string[], method: string, path: string): void {
    for (const secret of secrets) this.o.report?.({ kind, secret, host: this.o.host, method, path: pathOnly(path) });
  }
}

/**
 * Serves one sandbox connection until it closes. Resolves when it is over (a failed handshake
 * included: the client did not trust the leaf, or went away).
 */
export async function terminateTls(o: TerminateOptions): Promise<void> {
  const leaf = await o.leaves.leafFor(o.host);
  const conn = new Connection(o);
  // The server does the TLS handshake on the socket (and picks h2 or http/1.1 by ALPN); it is
  // this connection's alone, so its handlers know the sandbox without looking the socket up.
  const server = http2.createSecureServer({ key: leaf.key, cert: leaf.cert, allowHTTP1: true });
  server.on("request", (req: AnyRequest, res: AnyResponse) => {
    handleRequest(conn, req, res).catch((err: unknown) => fail(res, err));
  });
  server.on("upgrade", (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    handleUpgrade(conn, req, socket, head).catch(() => socket.destroy());
  });
  server.on("clientError", (err: Error, socket: Duplex) => {
    const text = parseErrorAnswer(err);
    if (text !== undefined && socket.writable) socket.end(text);
    socket.destroy();
  });
  server.on("tlsClientError", () => o.socket.destroy());
  server.on("sessionError", () => o.socket.destroy());
  // A reset by the sandbox ends the connection like a close does.
  o.socket.on("error", () => o.socket.destroy());
  const closed = new Promise<void>((resolve) => o.socket.once("close", () => resolve()));
  if (o.peeked.length > 0) o.socket.unshift(o.peeked);
  server.emit("connection", o.socket);
  await closed;
  conn.agent.destroy();
}

/** The request's headers fit to send upstream: no pseudo or hop-by-hop headers; Host is the SNI host. */
function forwardHeaders(headers: IncomingHttpHeaders, o: TerminateOptions, upgrade: boolean): Headers {
  const named = new Set(
    String(headers.connection ?? "")
      .split(",")
      .map((s) => s.trim().toLowerCase()),
  );
  const out: Headers = {};
  for (const [name, value] of Object.entries(headers)) {
    if (name.startsWith(":") || HOP_BY_HOP.has(name) || named.has(name) || name === "host") continue;
    out[name] = value;
  }
  out.host = o.port === undefined || o.port === 443 ? o.host : `${o.host}:${o.port}`;
  if (upgrade) {
    out.connection = "Upgrade";
    out.upgrade = headers.upgrade;
  }
  return out;
}

/**
 * What to do before anything goes upstream: refuse a placeholder of an unbound secret, ask the
 * policy, and swap the bound ones in. Answers and returns undefined when the request stops here.
 */
async function prepare(
  conn: Connection,
  req: AnyRequest,
  upgrade: boolean,
  answer: (status: number, body: string | object) => void,
  signal: AbortSignal,
): Promise<{ headers: Headers; needles: Needle[]; body: Readable } | undefined> {
  const method = req.method ?? "GET";
  const path = req.url ?? "/";
  const headers = forwardHeaders(req.headers, conn.o, upgrade);
  const refused = placeholdersIn(conn.unbound, path, headers);
  if (refused.length > 0) {
    conn.report(
      "secret_refused",
      refused.map((b) => b.name),
      method,
      path,
    );
    answer(403, refusal(conn.o.host, refused));
    return undefined;
  }
  // Where the body is read from: the request, or, once an approval read its first bytes, what peekBody handed back.
  let body: Readable = req;
  const excerpt = async (): Promise<Buffer> => {
    if (upgrade) return Buffer.alloc(0);
    const peeked = await peekBody(req, EXCERPT_BYTES);
    body = peeked.body;
    return peeked.excerpt;
  };
  const verdict = await conn.o.decide(method, path, signal, excerpt);
  if (verdict !== "allow") {
    answer(verdict.status, verdict.body);
    return undefined;
  }
  const values = new Map(
    await Promise.all(
      conn.bound.map(
        async (b) => [b.name, (await conn.o.secrets.reveal(conn.o.tenant, b.name)).toString("utf8")] as const,
      ),
    ),
  );
  const valueOf = (b: SecretBinding): string => values.get(b.name) ?? "";
  const swapped = swapHeaders(headers, conn.bound, valueOf);
  conn.report("secret_injected", swapped.used, method, path);
  // Responses must come back readable, or an echoed value could not be found in them; from a host
  // a value goes to, also whole: slices of an echo (byte ranges) could cut it where no needle sees it.
  swapped.headers["accept-encoding"] = "identity";
  if (conn.bound.length > 0) {
    delete swapped.headers.range;
    delete swapped.headers["if-range"];
  }
  const needles = conn.bound.flatMap((b) => echoNeedles(b.name, valueOf(b), b.placeholder));
  return { headers: swapped.headers, needles, body };
}

function upgradeRefusal(host: string, secrets: string[]): object {
  return toProblem(
    new BothyError(
      "egress_denied",
      `An upgrade (WebSocket) to ${host} is refused: secret ${secrets.join(", ")} is bound to this host, and the gateway does not scan the frames of an upgraded connection for its value. Use plain HTTPS requests to ${host}, or open the WebSocket from a sandbox without that secret.`,
      { details: { host, secrets, reason: "upgrade_on_bound_host" } },
    ),
  );
}

function refusal(host: string, refused: SecretBinding[]): object {
  const names = refused.map((b) => b.name).join(", ");
  return toProblem(
    new BothyError(
      "secret_refused",
      `The request carries the placeholder of secret ${names}, which is not bound to ${host}; it was not sent. A secret goes only to the hosts given in PUT /secrets/{name}.`,
      { details: { secrets: refused.map((b) => b.name), host } },
    ),
  );
}

/** `pooled`: the connection may serve later requests (only after an ordinary one, see request-framing.ts). */
function upstreamRequest(
  conn: Connection,
  address: string,
  method: string,
  path: string,
  headers: Headers,
  pooled: boolean,
): http.ClientRequest {
  return https.request({
    host: address,
    port: conn.o.port ?? 443,
    servername: conn.o.host,
    method,
    path,
    headers: headers as OutgoingHttpHeaders,
    agent: pooled ? conn.agent : false,
    ...(conn.o.upstreamCa === undefined ? {} : { ca: conn.o.upstreamCa }),
  });
}

async function handleRequest(conn: Connection, req: AnyRequest, res: AnyResponse): Promise<void> {
  const aborted = new AbortController();
  res.once("close", () => aborted.abort());
  const answer = (status: number, body: string | object): void => sendBody(res, status, body);
  // A body the gateway cannot frame for the upstream is refused before anything is judged or sent.
  const framing = requestFraming(req);
  if (!framing.ok) {
    req.resume();
    return sendBody(res, framing.error.status, toProblem(framing.error));
  }
  const prepared = await prepare(conn, req, false, answer, aborted.signal);
  if (!prepared) return void req.resume();
  const method = req.method ?? "GET";
  const path = req.url ?? "/";
  const address = await conn.upstreamAddress();
  const headers = framedHeaders(prepared.headers, framing.framing, framing.pooled);
  const up = upstreamRequest(conn, address, method, path, headers, framing.pooled);
  aborted.signal.addEventListener("abort", () => up.destroy());
  up.on("error", (err) => fail(res, err));
  up.once("response", (upRes) => {
    const status = upRes.statusCode ?? 502;
    // Only an answer that is scrubbed needs its plain bytes.
    const decoded =
      prepared.needles.length === 0
        ? { ok: true as const, headers: upRes.headers, body: upRes }
        : decodedResponse(upRes, isBodyless(method, status), () => res.destroy());
    if (!decoded.ok) {
      upRes.destroy();
      return sendBody(res, 502, undecodable(conn.o.host, decoded.coding));
    }
    res.writeHead(status, responseHeaders(decoded.headers, prepared.needles));
    upRes.on("error", () => res.destroy());
    decoded.body.pipe(scrubStream(prepared.needles)).pipe(res as NodeJS.WritableStream);
  });
  // The body is watched for placeholders of unbound secrets as it goes; one found stops the
  // request before its bytes are sent (the matcher holds back a possible beginning of one).
  // The request's body, or what peekBody handed back once an approval read its first bytes.
  const source = prepared.body;
  const watch = new StreamMatcher(
    conn.unbound.map((b) => ({ bytes: Buffer.from(b.placeholder), replacement: Buffer.alloc(0), id: b.name })),
  );
  // Bytes that do not fit the framing stop the request before they are written.
  const body = new FramedBody(framing.framing);
  source.on("error", () => up.destroy());
  source.pipe(body);
  body.on("error", (err) => {
    up.removeAllListeners("response");
    up.removeAllListeners("error");
    up.on("error", () => undefined);
    up.destroy();
    source.unpipe(body);
    source.resume();
    if (err instanceof FramingError) sendBody(res, err.error.status, toProblem(err.error));
    else res.destroy();
  });
  body.on("data", (chunk: Buffer) => {
    const { out, found } = watch.push(chunk);
    if (found.length > 0) {
      up.removeAllListeners("response");
      up.destroy();
      body.pause();
      conn.report("secret_refused", [...new Set(found)], method, path);
      const refused = conn.unbound.filter((b) => found.includes(b.name));
      return sendBody(res, 403, refusal(conn.o.host, refused));
    }
    if (out.length > 0 && !up.write(out)) {
      body.pause();
      up.once("drain", () => body.resume());
    }
  });
  body.once("end", () => {
    if (up.destroyed) return;
    up.end(watch.end());
  });
}

/**
 * An upgrade (WebSocket) request. To a host a secret is bound to it is refused: the frames that
 * would follow are not scanned, so an echo of the value would reach the sandbox. Elsewhere it is
 * judged like any request and sent on a connection of its own; the two sides are joined only
 * after the upstream's `101`, and any other answer is relayed and ends the connection, so nothing
 * the sandbox sends after the request reaches the upstream unjudged.
 */
async function handleUpgrade(conn: Connection, req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
  const aborted = new AbortController();
  socket.on("error", () => socket.destroy());
  socket.once("close", () => aborted.abort());
  const answer = (status: number, body: string | object): void => {
    socket.end(closingAnswer(status, typeof body === "string" ? body : JSON.stringify(body)));
  };
  const method = req.method ?? "GET";
  const path = req.url ?? "/";
  if (conn.bound.length > 0) {
    const names = conn.bound.map((b) => b.name);
    conn.report("secret_refused", names, method, path);
    return answer(403, upgradeRefusal(conn.o.host, names));
  }
  const framing = requestFraming(req);
  if (!framing.ok) return answer(framing.error.status, toProblem(framing.error));
  if (framing.framing.kind !== "none")
    return answer(
      400,
      toProblem(new BothyError("malformed_request", "An upgrade request through the gateway may not carry a body.")),
    );
  const prepared = await prepare(conn, req, true, answer, aborted.signal);
  if (!prepared) return;
  const address = await conn.upstreamAddress();
  const headers = framedHeaders(prepared.headers, framing.framing, true);
  const up = upstreamRequest(conn, address, method, path, headers, false);
  up.on("error", () => socket.destroy());
  up.once("upgrade", (upRes: IncomingMessage, upSocket: Duplex, upHead: Buffer) => {
    socket.write(statusBlock(upRes, prepared.needles));
    if (upHead.length > 0) socket.write(upHead);
    if (head.length > 0) upSocket.write(head);
    upSocket.pipe(socket).pipe(upSocket);
    upSocket.on("error", () => socket.destroy());
    upSocket.once("close", () => socket.destroy());
    socket.once("close", () => upSocket.destroy());
  });
  up.once("response", (upRes: IncomingMessage) => {
    // The upstream would not upgrade: its answer, scrubbed, and the connection ends.
    socket.write(statusBlock(upRes, prepared.needles, true));
    upRes.pipe(scrubStream(prepared.needles)).pipe(socket);
  });
  up.end();
}

function statusBlock(res: IncomingMessage, needles: Needle[], close = false): string {
  const lines = [`HTTP/1.1 ${res.statusCode ?? 502} ${res.statusMessage ?? ""}`];
  const headers = close ? responseHeaders(res.headers, needles) : res.headers;
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    for (const v of Array.isArray(value) ? value : [value])
      lines.push(`${scrubText(name, needles)}: ${scrubText(String(v), needles)}`);
  }
  if (close) lines.push("connection: close");
  return `${lines.join("\r\n")}\r\n\r\n`;
}

/**
 * Upstream's headers fit for the client: re-framed (the scrubbed body's length differs), names
 * and values scrubbed (a value is a valid header name when it is a token).
 */
function responseHeaders(headers: IncomingHttpHeaders, needles: Needle[]): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || HOP_BY_HOP.has(name) || name === "content-length") continue;
    out[scrubText(name, needles)] = Array.isArray(value)
      ? value.map((v) => scrubText(v, needles))
      : scrubText(value, needles);
  }
  return out;
}

/** A response compressed in a way the gateway cannot read: refused, since the scrubber could not look into it. */
function undecodable(host: string, coding: string): object {
  return toProblem(
    new BothyError(
      "upstream_failed",
      `${host} answered with an encoding the gateway cannot decode (${coding}) although it was asked for identity; the answer was not passed on, since it could not be checked for secret values. The gateway decodes gzip, deflate and br.`,
      { details: { host, encoding: coding } },
    ),
  );
}

function sendBody(res: AnyResponse, status: number, body: string | object): void {
  if (res.headersSent) return void res.destroy();
  const text = typeof body === "string" ? body : JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/problem+json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

/** The upstream failed: a 502 that says so, never with what the request carried. */
function fail(res: AnyResponse, err: unknown): void {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  const why = typeof code === "string" && /^[A-Z_]+$/.test(code) ? ` (${code})` : "";
  sendBody(
    res,
    502,
    toProblem(
      new BothyError("upstream_failed", `The gateway could not complete the request upstream${why}; retry later.`),
    ),
  );
}

function pathOnly(path: string): string {
  return path.split("?", 1)[0] ?? path;
}

/**
 * The proxy's terminator: each connection it hands over is served with the sandbox's bindings from
 * the vault and a leaf of the egress CA; a secret swapped in or refused is reported by name only.
 */
export function secretTerminator(deps: {
  vault: SecretSource;
  leaves: LeafIssuer;
  report(sandboxId: string, ev: SecretReport): void;
}): Terminate {
  return (ctx: TerminateContext) => {
    const sandboxId = ctx.sandbox.sandboxId;
    deps.vault
      .bindings(sandboxId)
      .then((bindings) =>
        terminateTls({
          socket: ctx.socket,
          peeked: ctx.peeked,
          host: ctx.host,
          tenant: ctx.sandbox.tenant,
          bindings,
          secrets: deps.vault,
          leaves: deps.leaves,
          dial: () => ctx.dial(),
          decide: (method, path, signal, excerpt) => ctx.decide(method, path, signal, excerpt),
          report: (ev) => deps.report(sandboxId, ev),
        }),
      )
      .catch(() => ctx.socket.destroy());
  };
}
