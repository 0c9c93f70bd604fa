/**
 * The egress gateway's transparent proxy. nftables redirects the TCP 80 and 443 of every sandbox
 * under a host policy to its two ports (network/nft-ruleset.ts); it knows the sandbox by the
 * connection's source address, reads the target from the HTTP `Host` or the TLS SNI, judges it
 * by the sandbox's effective policy (host-policy.ts), resolves the name itself and dials exactly
 * the address it checked, so a name that resolves to a private, pool or blocked address never
 * reaches one (DNS rebinding included). Every decision is a server event (the audit). Each
 * plain-HTTP body is framed by the gateway (request-framing.ts), so the upstream parses only the
 * requests judged, and an upgrade is joined only after the upstream's 101 (upgrade-join.ts).
 * This file is the transport (the listeners and relays); what each request may do is decided by
 * egress-decision.ts, which resolves and checks addresses with egress-resolver.ts.
 *
 * HTTPS is passed through as bytes after the ClientHello, unless the sandbox has secrets or a
 * rule needs the method and path: then the TLS terminator (the vault's) takes the connection.
 * `internet: false` with host rules: only hosts an allow rule names (or a person approved) and
 * `allow_out` addresses go out; the default never lets a request out then.
 */
import { once } from "node:events";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import { type AddressInfo, createServer, connect, type Server, type Socket } from "node:net";
import type { Duplex } from "node:stream";
import { BothyError, PLACEHOLDER_PREFIX } from "@bothy/protocol";
import type { Logger } from "../events/server-events.ts";
import type { GatewayPorts } from "../network/nft-ruleset.ts";
import type { ApprovalGate, GatewaySandbox, Terminate } from "./contracts.ts";
import { decide, needsRequestView } from "./host-policy.ts";
import { MAX_HELLO_BYTES, peekClientHello } from "./tls-client-hello.ts";
import { joinAfterSwitch } from "./upgrade-join.ts";
import {
  closingProblem,
  FramedBody,
  framedHeaders,
  FramingError,
  parseErrorAnswer,
  requestFraming,
  type Framing,
} from "./request-framing.ts";
import { EgressDecisions } from "./egress-decision.ts";
import type { SandboxLookup } from "./gateway-lookup.ts";
import { placeholderIn, PlaceholderGuard } from "./placeholder-guard.ts";
import { errCode, malformed, problemOf, Refusal, type Target } from "./egress-refusal.ts";

export interface EgressProxyOptions {
  /** The resolvers the proxy asks (BOTHY_DNS): the same the sandboxes are given. */
  dns: string[];
  log: Logger;
  /** Where `ask` rules wait for a person; absent: they are answered as denied (approvals not available). */
  gate?: ApprovalGate;
  /** Terminates the TLS of hosts that need it; absent: such connections are refused. */
  terminate?: Terminate;
  /** Default 0.0.0.0; nft accepts only redirected connections from gateway sandboxes on these ports. */
  host?: string;
  /** Default: any free ports. */
  ports?: Partial<GatewayPorts>;
  /** The ports upstreams are dialed on (default 80 and 443: what nft redirected); tests' servers use others. */
  upstream?: GatewayPorts;
}

/** The most of a held request's body the proxy keeps for an approval (its excerpt is the first 8 KiB). */
const MAX_HELD_BODY = 8 * 1024 * 1024;
const HELLO_TIMEOUT_MS = 10_000;
const HOP_BY_HOP = ["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"];
/** A TLS fatal alert, access_denied (RFC 8446 6.2), sent before closing a refused HTTPS connection. */
const ACCESS_DENIED_ALERT = Buffer.from([21, 3, 3, 0, 2, 2, 49]);

export class EgressProxy {
  private readonly httpListener: Server;
  private readonly tlsListener: Server;
  /** Parses the HTTP of accepted port-80 connections; it never listens itself. */
  private readonly parser: http.Server;
  private readonly decisions: EgressDecisions;
  private readonly agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
  private readonly sockets = new Set<Socket>();
  private lookup: SandboxLookup | undefined;
  private closing = false;
  private readonly upstream: GatewayPorts;
  private terminate: Terminate | undefined;

  constructor(private readonly opts: EgressProxyOptions) {
    this.upstream = opts.upstream ?? { http: 80, https: 443 };
    this.terminate = opts.terminate;
    this.decisions = new EgressDecisions({ dns: opts.dns, log: opts.log, ...(opts.gate ? { gate: opts.gate } : {}) });
    this.parser = http.createServer({ requireHostHeader: false });
    this.parser.on("request", (req: IncomingMessage, res: ServerResponse) => void this.onRequest(req, res));
    this.parser.on(
      "upgrade",
      (req: IncomingMessage, socket: Duplex, head: Buffer) => void this.onUpgrade(req, socket, head),
    );
    this.parser.on("clientError", (err: Error, socket: Duplex) => {
      const text = parseErrorAnswer(err);
      if (text !== undefined && socket.writable) socket.end(text);
      socket.destroy();
    });
    this.httpListener = createServer((s) => this.accept(s, (sb) => this.parser.emit("connection", s, sb)));
    this.tlsListener = createServer((s) => this.accept(s, (sb) => void this.onTls(s, sb)));
  }

  /** Listens on both ports; nft redirects to the ports this answers. */
  async listen(): Promise<GatewayPorts> {
    const host = this.opts.host ?? "0.0.0.0";
    this.httpListener.listen(this.opts.ports?.http ?? 0, host);
    this.tlsListener.listen(this.opts.ports?.https ?? 0, host);
    await Promise.all([once(this.httpListener, "listening"), once(this.tlsListener, "listening")]);
    return {
      http: (this.httpListener.address() as AddressInfo).port,
      https: (this.tlsListener.address() as AddressInfo).port,
    };
  }

  /**
   * From now on connections are judged; before, every one is refused. The approval gate and the
   * TLS terminator can be given here, once the parts they need exist.
   */
  attach(lookup: SandboxLookup, parts: { gate?: ApprovalGate; terminate?: Terminate } = {}): void {
    this.lookup = lookup;
    this.decisions.attach(lookup, parts.gate);
    if (parts.terminate) this.terminate = parts.terminate;
  }

  /** Held requests answer `503` retryable (nothing goes out later), listeners and connections close. */
  async close(): Promise<void> {
    this.closing = true;
    const held = this.decisions.stop();
    const closed = [this.httpListener, this.tlsListener].map(
      (s) => new Promise<void>((resolve) => (s.listening ? s.close(() => resolve()) : resolve())),
    );
    // The answers to held requests (503 retryable) are written before their sockets go.
    await held;
    await new Promise((r) => setImmediate(r));
    for (const s of this.sockets) s.destroy();
    this.agent.destroy();
    this.decisions.cancelLookups();
    await Promise.all(closed);
  }

  private accept(socket: Socket, go: (sb: GatewaySandbox) => void): void {
    socket.on("error", () => undefined);
    // A relay: small writes (TLS handshakes) go on at once, not after Nagle's wait.
    socket.setNoDelay(true);
    // What the sandbox sends meanwhile waits in the socket (nothing reads it yet).
    (this.closing
      ? Promise.resolve(undefined)
      : (this.lookup?.sandboxOf(socket.remoteAddress ?? "") ?? Promise.resolve(undefined))
    )
      .then((sb) => this.accepted(socket, this.closing ? undefined : sb, go))
      .catch(() => socket.destroy());
  }

  private accepted(socket: Socket, sb: GatewaySandbox | undefined, go: (sb: GatewaySandbox) => void): void {
    // Only a gateway sandbox's own address: nft lets nothing else in, and this holds without nft too.
    if (!sb) {
      socket.destroy();
      return;
    }
    this.sockets.add(socket);
    socket.once("close", () => this.sockets.delete(socket));
    accepted.add(socket);
    go(sb);
  }

  // ---- plain HTTP ---------------------------------------------------------------------------------

  /** Looked up per request: a policy changed since the connection opened applies to its next request. */
  private async sandboxOfRequest(req: IncomingMessage): Promise<GatewaySandbox | undefined> {
    if (!accepted.has(req.socket)) return undefined;
    return this.lookup?.sandboxOf(req.socket.remoteAddress ?? "");
  }

  private async onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const sb = await this.sandboxOfRequest(req);
    if (!sb) return void res.destroy();
    const target = httpTarget(req);
    const abort = new AbortController();
    res.once("close", () => {
      if (!res.writableFinished) abort.abort();
    });
    try {
      if (!target) throw new Refusal(malformed("A request through the gateway needs a Host header naming a host."));
      const framing = requestFraming(req);
      if (!framing.ok) throw this.framingRefusal(sb, target, framing.error, res);
      const placeholder = placeholderIn(req);
      if (placeholder) throw this.decisions.placeholderRefusal(sb, target, placeholder);
      const decision = decide(sb.policy, target);
      const body =
        decision.action === "ask" && !(await this.decisions.granted(sb, target.host)) ? await readBody(req) : undefined;
      if (body?.includes(PLACEHOLDER_PREFIX))
        throw this.decisions.placeholderRefusal(sb, target, "a placeholder in the body");
      const address = await this.decisions.judge(sb, target, decision, abort.signal, body);
      await this.forward(req, res, address, { ...framing, body }, () =>
        this.decisions.placeholderRefusal(sb, target, "a placeholder in the body"),
      );
    } catch (err) {
      answer(res, err);
    }
  }

  /**
   * A request whose body the gateway cannot frame for the upstream (request-framing.ts): refused
   * before it is judged, and the connection closes after the answer.
   */
  private framingRefusal(
    sb: GatewaySandbox,
    target: Target,
    error: BothyError,
    res: ServerResponse | undefined,
  ): Refusal {
    const refusal = this.decisions.framingRefusal(sb, target, error);
    if (res) res.shouldKeepAlive = false;
    return refusal;
  }

  /**
   * Sends the request to the checked address and relays the answer. The body is framed by the
   * gateway (a held one by its length) and goes on a pooled connection only after an ordinary
   * request. A streamed body is scanned for placeholders on the way: one found, or bytes that do
   * not fit the framing, abort the upstream request (it never completes).
   */
  private forward(
    req: IncomingMessage,
    res: ServerResponse,
    address: string,
    sending: { framing: Framing; pooled: boolean; body: Buffer | undefined },
    placeholderFound: () => Refusal,
  ): Promise<void> {
    return new Promise<void>((resolve) => {
      const { body, pooled } = sending;
      const framing: Framing =
        body === undefined
          ? sending.framing
          : body.length > 0
            ? { kind: "length", length: body.length }
            : { kind: "none" };
      const headers = framedHeaders(withoutHopByHop(req.headers), framing, pooled);
      const up = http.request(
        {
          host: address,
          port: this.upstream.http,
          method: req.method,
          path: req.url,
          headers,
          agent: pooled ? this.agent : false,
          setHost: false,
        },
        (upRes) => {
          res.writeHead(upRes.statusCode ?? 502, upRes.statusMessage, withoutHopByHop(upRes.headers));
          upRes.pipe(res);
          upRes.once("end", resolve);
        },
      );
      let refused = false;
      up.once("error", (err) => {
        if (refused) return;
        if (!res.headersSent)
          answer(
            res,
            new BothyError("egress_unreachable", `The upstream ${address} did not answer (${errCode(err)}).`),
          );
        else res.destroy();
        resolve();
      });
      res.once("close", () => {
        if (!res.writableFinished) up.destroy();
      });
      if (body) return void up.end(body);
      const framed = new FramedBody(framing);
      const guard = new PlaceholderGuard();
      const stop = (refusal: Refusal): void => {
        if (refused) return;
        refused = true;
        req.unpipe(framed);
        framed.unpipe(guard);
        req.resume();
        up.destroy();
        res.shouldKeepAlive = false;
        answer(res, refusal);
        resolve();
      };
      framed.once("error", (err) =>
        stop(new Refusal(err instanceof FramingError ? err.error : malformed(err.message))),
      );
      guard.once("error", () => stop(placeholderFound()));
      req.pipe(framed).pipe(guard).pipe(up);
    });
  }

  /**
   * A WebSocket (or any) upgrade is judged by its request (which may not carry a body), sent on a
   * connection of its own, and the two sides are joined only after the upstream's `101`. Any other
   * answer is relayed and the connection ends: what the sandbox sent after the request (held
   * until the 101) never reaches the upstream unjudged.
   */
  private async onUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const abort = new AbortController();
    socket.on("error", () => socket.destroy());
    socket.once("close", () => abort.abort());
    const sb = await this.sandboxOfRequest(req);
    const target = httpTarget(req);
    if (!sb || !target || socket.destroyed) return void socket.destroy();
    try {
      const framing = requestFraming(req);
      if (!framing.ok) throw this.framingRefusal(sb, target, framing.error, undefined);
      if (framing.framing.kind !== "none")
        throw this.framingRefusal(
          sb,
          target,
          malformed("An upgrade request through the gateway may not carry a body."),
          undefined,
        );
      const placeholder = placeholderIn(req);
      if (placeholder) throw this.decisions.placeholderRefusal(sb, target, placeholder);
      const address = await this.decisions.judge(sb, target, decide(sb.policy, target), abort.signal, Buffer.alloc(0));
      if (socket.destroyed) return;
      joinAfterSwitch({
        socket,
        head,
        address,
        port: this.upstream.http,
        method: req.method ?? "GET",
        path: req.url ?? "/",
        headers: framedHeaders(withoutHopByHop(req.headers), { kind: "none" }, true),
        upgrade: String(req.headers.upgrade ?? ""),
        gone: abort.signal,
        relayHeaders: withoutHopByHop,
        unreachable: (err) =>
          closingProblem(
            problemOf(
              new BothyError("egress_unreachable", `The upstream ${address} did not answer (${errCode(err)}).`),
            ),
          ),
      });
    } catch (err) {
      socket.end(closingProblem(problemOf(err)));
    }
  }

  // ---- HTTPS ------------------------------------------------------------------------------------

  private async onTls(socket: Socket, sb: GatewaySandbox): Promise<void> {
    const hello = await readHello(socket);
    if (hello.kind !== "hello" || hello.sni === null) {
      const host = socket.remoteAddress ?? "";
      this.decisions.emit(
        "egress_denied",
        sb,
        { host: "", method: null, path: null },
        { rule: "sni", action: "deny", outcome: "refused" },
        hello.kind === "hello" ? "no server name (SNI) in the ClientHello" : `not a TLS ClientHello (${host})`,
      );
      return void socket.end(ACCESS_DENIED_ALERT);
    }
    const host = hello.sni;
    const peeked = hello.bytes;
    const abort = new AbortController();
    socket.once("close", () => abort.abort());
    if (sb.policy.secrets.length > 0 || needsRequestView(sb.policy, host)) {
      if (!this.terminate) {
        this.decisions.emit(
          "egress_denied",
          sb,
          { host, method: null, path: null },
          { rule: "terminator", action: "deny", outcome: "unavailable" },
          "this host's requests must be seen (secrets or method/path rules) and no TLS terminator is configured",
        );
        return void socket.end(ACCESS_DENIED_ALERT);
      }
      this.terminate({
        socket,
        peeked,
        host,
        sandbox: sb,
        dial: () => this.decisions.checkedAddress(sb, { host, method: null, path: null }, true),
        decide: (method, path, signal, excerpt) =>
          this.decisions.verdict(sb, { host, method, path, since: performance.now() }, signal, excerpt),
      });
      return;
    }
    try {
      const target = { host, method: null, path: null, since: performance.now() };
      const address = await this.decisions.judge(sb, target, decide(sb.policy, target), abort.signal, Buffer.alloc(0));
      if (socket.destroyed) return;
      const up = connect({ host: address, port: this.upstream.https, noDelay: true });
      up.once("error", () => socket.destroy());
      socket.once("error", () => up.destroy());
      up.write(peeked);
      socket.pipe(up).pipe(socket);
      socket.resume();
    } catch {
      socket.end(ACCESS_DENIED_ALERT);
    }
  }
}

/** Connections accepted from a gateway sandbox (the HTTP parser sees only these). */
const accepted = new WeakSet<object>();

function httpTarget(req: IncomingMessage): Target | undefined {
  const raw = req.headers.host;
  if (!raw) return undefined;
  const host = raw
    .replace(/:\d+$/, "")
    .replace(/^\[|\]$/g, "")
    .toLowerCase()
    .replace(/\.$/, "");
  if (!/^[a-z0-9.-]{1,253}$/.test(host)) return undefined;
  return { host, method: req.method ?? "GET", path: req.url ?? "/", since: performance.now() };
}

async function readBody(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_HELD_BODY)
      throw new Refusal(
        new BothyError("body_too_large", `A request held for approval may carry at most ${MAX_HELD_BODY} bytes.`),
      );
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

/** Reads until the first TLS record is whole (or is not a ClientHello), then stops reading. */
async function readHello(
  socket: Socket,
): Promise<{ kind: "hello"; sni: string | null; bytes: Buffer } | { kind: "invalid" }> {
  let buf = Buffer.alloc(0);
  return new Promise((resolve) => {
    const timer = setTimeout(() => finish({ kind: "invalid" }), HELLO_TIMEOUT_MS);
    const finish = (r: { kind: "hello"; sni: string | null; bytes: Buffer } | { kind: "invalid" }): void => {
      clearTimeout(timer);
      socket.off("data", onData);
      socket.off("close", onClose);
      socket.pause();
      resolve(r);
    };
    const onClose = (): void => finish({ kind: "invalid" });
    const onData = (d: Buffer): void => {
      buf = Buffer.concat([buf, d]);
      const peek = peekClientHello(buf);
      if (peek.kind === "hello") finish({ kind: "hello", sni: peek.sni, bytes: buf });
      else if (peek.kind === "invalid" || buf.length > MAX_HELLO_BYTES) finish({ kind: "invalid" });
    };
    socket.on("data", onData);
    socket.once("close", onClose);
  });
}

function withoutHopByHop(headers: http.IncomingHttpHeaders): http.OutgoingHttpHeaders {
  const out: http.OutgoingHttpHeaders = { ...headers };
  for (const h of HOP_BY_HOP) delete out[h];
  return out;
}

function answer(res: ServerResponse, err: unknown): void {
  if (res.headersSent || res.destroyed) return void res.destroy();
  const problem = problemOf(err);
  const text = JSON.stringify(problem);
  res.writeHead(problem.status, {
    "content-type": "application/problem+json",
    "content-length": Buffer.byteLength(text),
  });
  res.end(text);
}
