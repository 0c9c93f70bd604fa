/**
 * The egress gateway's transparent proxy. nftables redirects the TCP 80 and 443 of every sandbox
 * under a host policy to its two ports (network/nft-ruleset.ts); it knows the sandbox by the
 * connection's source address, reads the target from the HTTP `Host` or the TLS SNI, judges it
 * by the sandbox's effective policy (host-policy.ts), resolves the name itself and dials exactly
 * the address it checked, so a name that resolves to a private, pool or blocked address never
 * reaches one (DNS rebinding included). Every decision is a server event (the audit). Each
 * plain-HTTP body is framed by the gateway (request-framing.ts), so the upstream parses only the
 * requests judged, and an upgrade is joined only after the upstream's 101 (upgrade-join.ts).
 *
 * HTTPS is passed through as bytes after the ClientHello, unless the sandbox has secrets or a
 * rule needs the method and path: then the TLS terminator (the vault's) takes the connection.
 * `internet: false` with host rules: only hosts an allow rule names (or a person approved) and
 * `allow_out` addresses go out; the default never lets a request out then.
 */
import { Resolver } from "node:dns/promises";
import { once } from "node:events";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import { isIPv4, type AddressInfo, createServer, connect, type Server, type Socket } from "node:net";
import { Transform, type Duplex, type TransformCallback } from "node:stream";
import { BothyError, PLACEHOLDER_PREFIX, toProblem, type EffectiveHostPolicy } from "@bothy/protocol";
import type { EgressDecisionFields, Logger } from "../events/server-events.ts";
import { cidrContains, parseCidr, parseIpv4 } from "../network/ipv4.ts";
import type { GatewayPorts } from "../network/nft-ruleset.ts";
import type { HostNetwork } from "../network/host-network.ts";
import type { Ledger } from "../ledger/ledger.ts";
import type { GatewayPolicies } from "./policies.ts";
import type { ApprovalGate, EgressVerdict, GatewaySandbox, Terminate } from "./contracts.ts";
import { decide, needsRequestView, type Decision } from "./host-policy.ts";
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

/** Who is behind a source address: a gateway sandbox, and the ranges no sandbox may reach. */
export interface SandboxLookup {
  sandboxOf(address: string): GatewaySandbox | undefined;
  /** PRIVATE_RANGES, the pool and BOTHY_NET_BLOCK. */
  blocked(): readonly string[];
  /** Refused even when `allow_out` names it: loopback, 0/8, the pool and the host's own addresses. */
  unreachable?(): readonly string[];
}

/** The most of a held request's body the proxy keeps for an approval (its excerpt is the first 8 KiB). */
const MAX_HELD_BODY = 8 * 1024 * 1024;
const EXCERPT_BYTES = 8 * 1024;
const HELLO_TIMEOUT_MS = 10_000;
const RESOLVE_TIMEOUT_MS = 5_000;
const DNS_CACHE_MAX_S = 60;
const DNS_CACHE_ENTRIES = 4096;
const HOP_BY_HOP = ["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"];
/** A TLS fatal alert, access_denied (RFC 8446 6.2), sent before closing a refused HTTPS connection. */
const ACCESS_DENIED_ALERT = Buffer.from([21, 3, 3, 0, 2, 2, 49]);

/** What a request is judged as. */
interface Target {
  host: string;
  method: string | null;
  path: string | null;
  /** When the request reached the gateway (`performance.now()`), for the decision's latency. */
  since?: number;
}

/** A refusal: the problem a plain-HTTP client gets (HTTPS gets the alert), and the event it was. */
class Refusal extends Error {
  constructor(readonly error: BothyError) {
    super(error.message);
  }
}

export class EgressProxy {
  private readonly httpListener: Server;
  private readonly tlsListener: Server;
  /** Parses the HTTP of accepted port-80 connections; it never listens itself. */
  private readonly parser: http.Server;
  private readonly resolver: Resolver;
  private readonly agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
  private readonly sockets = new Set<Socket>();
  /** Requests held for an approval: aborted when the server stops; each settles once its gate answered. */
  private readonly held = new Map<AbortController, Promise<void>>();
  private lookup: SandboxLookup | undefined;
  private closing = false;
  private readonly upstream: GatewayPorts;
  private gate: ApprovalGate | undefined;
  private terminate: Terminate | undefined;
  /** Answers by name until their TTL (at most DNS_CACHE_MAX_S): every address is still checked on each use. */
  private readonly answers = new Map<string, { addresses: string[]; until: number }>();

  constructor(private readonly opts: EgressProxyOptions) {
    this.upstream = opts.upstream ?? { http: 80, https: 443 };
    this.gate = opts.gate;
    this.terminate = opts.terminate;
    this.resolver = new Resolver({ timeout: RESOLVE_TIMEOUT_MS, tries: 2 });
    this.resolver.setServers(opts.dns);
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
    if (parts.gate) this.gate = parts.gate;
    if (parts.terminate) this.terminate = parts.terminate;
  }

  /** Held requests answer `503` retryable (nothing goes out later), listeners and connections close. */
  async close(): Promise<void> {
    this.closing = true;
    const held = [...this.held];
    for (const [c] of held) c.abort();
    const closed = [this.httpListener, this.tlsListener].map(
      (s) => new Promise<void>((resolve) => (s.listening ? s.close(() => resolve()) : resolve())),
    );
    // The answers to held requests (503 retryable) are written before their sockets go.
    await Promise.all(held.map(([, settled]) => settled));
    await new Promise((r) => setImmediate(r));
    for (const s of this.sockets) s.destroy();
    this.agent.destroy();
    this.resolver.cancel();
    await Promise.all(closed);
  }

  private accept(socket: Socket, go: (sb: GatewaySandbox) => void): void {
    socket.on("error", () => undefined);
    // A relay: small writes (TLS handshakes) go on at once, not after Nagle's wait.
    socket.setNoDelay(true);
    const sb = this.closing ? undefined : this.lookup?.sandboxOf(socket.remoteAddress ?? "");
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
  private sandboxOfRequest(req: IncomingMessage): GatewaySandbox | undefined {
    if (!accepted.has(req.socket)) return undefined;
    return this.lookup?.sandboxOf(req.socket.remoteAddress ?? "");
  }

  private async onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const sb = this.sandboxOfRequest(req);
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
      if (placeholder) throw this.placeholderRefusal(sb, target, placeholder);
      const decision = decide(sb.policy, target);
      const body = decision.action === "ask" && !this.granted(sb, target.host) ? await readBody(req) : undefined;
      if (body?.includes(PLACEHOLDER_PREFIX)) throw this.placeholderRefusal(sb, target, "a placeholder in the body");
      const address = await this.judge(sb, target, decision, abort.signal, body);
      await this.forward(req, res, address, { ...framing, body }, () =>
        this.placeholderRefusal(sb, target, "a placeholder in the body"),
      );
    } catch (err) {
      answer(res, err);
    }
  }

  /** A secret's placeholder in clear HTTP: refused and reported (what carried it, never its value). */
  private placeholderRefusal(sb: GatewaySandbox, target: Target, where: string): Refusal {
    this.emit("egress_denied", sb, target, { rule: "placeholder", action: "deny", outcome: "refused" }, where);
    return new Refusal(
      new BothyError(
        "egress_denied",
        `A secret's placeholder (${PLACEHOLDER_PREFIX}…) was sent in clear HTTP to ${target.host} (${where}); secrets only go out over HTTPS to the hosts they are bound to.`,
        { details: { host: target.host, rule: "placeholder" } },
      ),
    );
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
    this.emit("egress_denied", sb, target, { rule: "framing", action: "deny", outcome: "refused" }, error.message);
    if (res) res.shouldKeepAlive = false;
    return new Refusal(error);
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
    const sb = this.sandboxOfRequest(req);
    const target = httpTarget(req);
    if (!sb || !target) return void socket.destroy();
    const abort = new AbortController();
    socket.on("error", () => socket.destroy());
    socket.once("close", () => abort.abort());
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
      if (placeholder) throw this.placeholderRefusal(sb, target, placeholder);
      const address = await this.judge(sb, target, decide(sb.policy, target), abort.signal, Buffer.alloc(0));
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
      this.emit(
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
        this.emit(
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
        dial: () => this.checkedAddress(sb, { host, method: null, path: null }, true),
        decide: (method, path, signal, excerpt) =>
          this.verdict(sb, { host, method, path, since: performance.now() }, signal, excerpt),
      });
      return;
    }
    try {
      const target = { host, method: null, path: null, since: performance.now() };
      const address = await this.judge(sb, target, decide(sb.policy, target), abort.signal, Buffer.alloc(0));
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

  /**
   * The terminator's per-request question: the rules and approvals, answered as a verdict. A
   * request held for a person shows its body's first bytes, as on plain HTTP.
   */
  private async verdict(
    sb: GatewaySandbox,
    target: Target,
    signal: AbortSignal,
    excerpt?: () => Promise<Buffer>,
  ): Promise<EgressVerdict> {
    try {
      const decision = decide(sb.policy, target);
      if (sb.internet === false && decision.rule === "default" && decision.action === "allow") {
        this.emit(
          "egress_denied",
          sb,
          target,
          { rule: "default", action: "allow", outcome: "refused" },
          "internet is off",
        );
        throw new Refusal(denial(sb, target, "default"));
      }
      const held = decision.action === "ask" && !this.granted(sb, target.host);
      const body = held && excerpt ? await excerpt() : Buffer.alloc(0);
      await this.approve(sb, target, decision, signal, body, undefined);
      return "allow";
    } catch (err) {
      const problem = problemOf(err);
      return { status: problem.status, body: problem };
    }
  }

  // ---- judging ----------------------------------------------------------------------------------

  private granted(sb: GatewaySandbox, host: string): boolean {
    return this.gate?.granted(sb.sandboxId, host) ?? false;
  }

  /**
   * The address a request may go to, or a Refusal: the rules first (a denied host is never
   * resolved), then the resolved address's checks, then, for `ask`, a person's answer.
   */
  private async judge(
    sb: GatewaySandbox,
    target: Target,
    decision: Decision,
    signal: AbortSignal,
    body: Buffer | undefined,
  ): Promise<string> {
    if (decision.action === "deny") throw this.denied(sb, target, decision, {});
    const address = await this.checkedAddress(sb, target, decision.rule !== "default" || decision.action === "ask");
    await this.approve(sb, target, decision, signal, body, address);
    return address;
  }

  /** A denial as an event and the refusal to answer with; a path without one reading is refused as such. */
  private denied(
    sb: GatewaySandbox,
    target: Target,
    decision: Decision,
    base: Pick<EgressDecisionFields, "address">,
  ): Refusal {
    const fields = { ...base, rule: decision.rule, action: "deny" as const };
    if (decision.ambiguousPath === undefined) {
      this.emit("egress_denied", sb, target, { ...fields, outcome: "denied" });
      return new Refusal(denial(sb, target, decision.rule));
    }
    this.emit(
      "egress_denied",
      sb,
      target,
      { ...fields, outcome: "refused" },
      `ambiguous path: ${decision.ambiguousPath}`,
    );
    return new Refusal(ambiguousPath(target, decision.rule, decision.ambiguousPath));
  }

  /** Allows an allow; holds an ask until a person answers; emits the decision. */
  private async approve(
    sb: GatewaySandbox,
    target: Target,
    decision: Decision,
    signal: AbortSignal,
    body: Buffer | undefined,
    address: string | undefined,
  ): Promise<void> {
    const base = { rule: decision.rule, action: decision.action, ...(address ? { address } : {}) } as const;
    if (decision.action === "deny") throw this.denied(sb, target, decision, base);
    if (decision.action === "allow") return this.emit("egress_allowed", sb, target, { ...base, outcome: "allowed" });
    if (this.granted(sb, target.host)) return this.emit("egress_allowed", sb, target, { ...base, outcome: "granted" });
    const gate = this.gate;
    if (!gate) {
      this.emit("egress_denied", sb, target, { ...base, outcome: "unavailable" }, "approvals are not available");
      throw new Refusal(
        new BothyError(
          "egress_denied",
          `Rule ${decision.rule} asks a person before ${describe(target)} goes out, and approvals are not available on this server; the request was not sent.`,
          { details: { host: target.host, rule: decision.rule, how_to_get_access: howToAsk(sb) } },
        ),
      );
    }
    const held = new AbortController();
    const onAbort = (): void => held.abort();
    signal.addEventListener("abort", onAbort);
    let settle = (): void => undefined;
    this.held.set(held, new Promise<void>((resolve) => (settle = resolve)));
    this.emit("egress_asked", sb, target, { ...base, outcome: "pending" });
    try {
      const outcome = await gate.ask(
        {
          tenant: sb.tenant,
          sandboxId: sb.sandboxId,
          conversationId: null,
          kind: "http",
          method: target.method,
          host: target.host,
          path: target.path,
          tool: null,
          excerpt: (body ?? Buffer.alloc(0)).subarray(0, EXCERPT_BYTES).toString("utf8"),
          rule: decision.rule,
        },
        held.signal,
      );
      if (outcome.state === "approved")
        return this.emit(
          "egress_allowed",
          sb,
          target,
          { ...base, outcome: "approved" },
          `approval ${outcome.approvalId}`,
        );
      const which = `approval ${outcome.approvalId}${outcome.cancelReason ? `: ${outcome.cancelReason}` : ""}`;
      this.emit("egress_denied", sb, target, { ...base, outcome: outcome.state }, which);
      // Cancelled while the client still waits: the server is stopping (the gate's own stop or ours).
      if (outcome.state === "cancelled" || this.closing) throw new Refusal(stopping(outcome.approvalId));
      throw new Refusal(
        new BothyError(
          "egress_denied",
          `${describe(target)} waited for approval ${outcome.approvalId}, which was ${outcome.state}${outcome.reason ? ` (${outcome.reason})` : ""}; the request was not sent.`,
          {
            details: { host: target.host, rule: decision.rule, approval_id: outcome.approvalId, state: outcome.state },
          },
        ),
      );
    } catch (err) {
      if (err instanceof Refusal) throw err;
      this.emit("egress_denied", sb, target, { ...base, outcome: "cancelled" });
      throw new Refusal(stopping(null));
    } finally {
      signal.removeEventListener("abort", onAbort);
      this.held.delete(held);
      settle();
    }
  }

  /**
   * Resolves the host (an IPv4 literal is itself) with the server's resolvers and returns the
   * first address the sandbox may reach; refused with the reason when none is. `explicit`: an
   * allow rule or an approval named this host (what `internet: false` lets out).
   */
  private async checkedAddress(sb: GatewaySandbox, target: Target, explicit: boolean): Promise<string> {
    let addresses: string[];
    if (isIPv4(target.host)) addresses = [target.host];
    else if (sb.internet === false && !explicit) {
      // Not even looked up: the name would reach BOTHY_DNS's upstreams, a channel out of a closed sandbox.
      const reason = "internet is off and no allow rule names this host";
      this.emit("egress_denied", sb, target, { rule: "address", action: "deny", outcome: "refused" }, reason);
      throw new Refusal(
        new BothyError("egress_denied", `${target.host} was not looked up: ${reason}.`, {
          details: { host: target.host, rule: "address", how_to_get_access: howToAsk(sb) },
        }),
      );
    } else {
      try {
        addresses = await this.resolve(target.host);
      } catch (err) {
        this.emit(
          "egress_denied",
          sb,
          target,
          { rule: "address", action: "deny", outcome: "unresolved" },
          `${target.host} does not resolve (${errCode(err)})`,
        );
        throw new Refusal(
          new BothyError("egress_unreachable", `${target.host} does not resolve (${errCode(err)}).`, {
            details: { host: target.host },
          }),
        );
      }
    }
    const reasons: string[] = [];
    for (const address of addresses) {
      const why = this.refusalOf(sb, address, explicit);
      if (why === undefined) return address;
      reasons.push(`${address}: ${why}`);
    }
    const reason = reasons.join("; ");
    this.emit("egress_denied", sb, target, { rule: "address", action: "deny", outcome: "refused" }, reason);
    throw new Refusal(
      new BothyError(
        "egress_denied",
        `${target.host} resolves only to addresses this sandbox may not reach (${reason}).`,
        {
          details: { host: target.host, rule: "address", how_to_get_access: howToAsk(sb) },
        },
      ),
    );
  }

  private async resolve(host: string): Promise<string[]> {
    const cached = this.answers.get(host);
    if (cached && cached.until > Date.now()) return cached.addresses;
    const records = await this.resolver.resolve4(host, { ttl: true });
    const ttl = Math.min(DNS_CACHE_MAX_S, ...records.map((r) => r.ttl));
    const addresses = records.map((r) => r.address);
    if (this.answers.size >= DNS_CACHE_ENTRIES) this.answers.clear();
    if (ttl > 0) this.answers.set(host, { addresses, until: Date.now() + ttl * 1000 });
    return addresses;
  }

  /** Why the sandbox may not reach this address, as the nft rules judge it; undefined: it may. */
  private refusalOf(sb: GatewaySandbox, address: string, explicit: boolean): string | undefined {
    const a = parseIpv4(address);
    const inside = (list: readonly string[]): string | undefined => list.find((c) => cidrContains(parseCidr(c), a));
    const never = inside(this.lookup?.unreachable?.() ?? []);
    if (never) return `in ${never}, the host or other sandboxes, which no sandbox reaches`;
    if (inside(sb.allowOut)) return undefined;
    const denied = inside(sb.denyOut);
    if (denied) return `in deny_out ${denied}`;
    const blocked = inside(this.lookup?.blocked() ?? []);
    if (blocked) return `in ${blocked}, which no sandbox reaches unless allow_out names it`;
    if (sb.internet === false && !explicit) return "internet is off and no allow rule names this host";
    return undefined;
  }

  private emit(
    event: "egress_allowed" | "egress_denied" | "egress_asked",
    sb: GatewaySandbox,
    target: Target,
    d: Pick<EgressDecisionFields, "rule" | "action" | "outcome" | "address">,
    reason?: string,
  ): void {
    const fields = {
      sandbox_id: sb.sandboxId,
      host: target.host,
      method: target.method,
      path: target.path === null ? null : target.path.split("?", 1)[0]!,
      ...d,
      ...(reason === undefined ? {} : { reason }),
      ...(target.since === undefined ? {} : { ms: performance.now() - target.since }),
    };
    // After this turn's I/O is under way: the audit's ledger write is not on the request's path.
    setImmediate(() => this.opts.log(event, fields));
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

/** The name of a header (or `url`) that carries a secret's placeholder, if any. */
function placeholderIn(req: IncomingMessage): string | undefined {
  if ((req.url ?? "").includes(PLACEHOLDER_PREFIX)) return "a placeholder in the URL";
  for (let i = 0; i < req.rawHeaders.length; i += 2)
    if (req.rawHeaders[i + 1]?.includes(PLACEHOLDER_PREFIX))
      return `a placeholder in header ${req.rawHeaders[i]?.toLowerCase()}`;
  return undefined;
}

/** Passes a body on unchanged, failing at a placeholder (also one split across chunks). */
class PlaceholderGuard extends Transform {
  private tail = "";
  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    const text = this.tail + chunk.toString("latin1");
    if (text.includes(PLACEHOLDER_PREFIX)) return done(new Error("a placeholder in the body"));
    this.tail = text.slice(-(PLACEHOLDER_PREFIX.length - 1));
    done(null, chunk);
  }
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

const describe = (t: Target): string =>
  t.method === null ? `HTTPS to ${t.host}` : `${t.method} ${t.host}${t.path ?? ""}`;

/** How a sandbox's user gets a host allowed: which policy holds the rule that decided. */
function howToAsk(sb: GatewaySandbox): string {
  return `A sandbox's own host rules are given at create (the \`policy\` field: allow_hosts, rules); its tenant's default with PUT /policy (scope \`policy\`), whose rules come first. See GET /sandboxes/${sb.sandboxId} for the effective policy.`;
}

function denial(sb: GatewaySandbox, target: Target, rule: string): BothyError {
  const which =
    rule === "default"
      ? "the policy's default (no rule names this host)"
      : `rule ${rule} (the ${rule.startsWith("tenant") ? "tenant's" : "sandbox's"} host rules, index ${rule.split("#")[1]})`;
  return new BothyError("egress_denied", `${describe(target)} was denied by ${which}.`, {
    details: { host: target.host, rule, how_to_get_access: howToAsk(sb) },
  });
}

/** A path the rules cannot judge: refused rather than read one way when the upstream may read it another. */
function ambiguousPath(target: Target, rule: string, problem: string): BothyError {
  return new BothyError(
    "egress_denied",
    `${target.method ?? "A request"} to ${target.host} was refused: servers read its path in different ways (${problem}), and rule ${rule} judges paths. Send it as a browser or curl would: with . and .. resolved, no //, and without %2F, %5C, %2E, %25, escaped control characters, backslashes or ";" after a dot segment.`,
    { details: { host: target.host, rule, reason: "ambiguous_path", problem } },
  );
}

/** A held request's answer when the server stops: nothing was sent, so retrying is safe. */
const stopping = (approvalId: string | null): BothyError =>
  new BothyError(
    "shutting_down",
    "The server stopped while this request waited for approval; it was not sent: retry.",
    {
      details: { retryable: true, ...(approvalId ? { approval_id: approvalId } : {}) },
    },
  );

const malformed = (message: string): BothyError => new BothyError("malformed_request", message);

function problemOf(err: unknown): ReturnType<typeof toProblem> {
  if (err instanceof Refusal) return toProblem(err.error);
  if (err instanceof BothyError) return toProblem(err);
  return toProblem(new BothyError("egress_unreachable", `The gateway could not send this request (${errCode(err)}).`));
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

const errCode = (err: unknown): string =>
  (err as { code?: string }).code ?? (err instanceof Error ? err.message : "unknown error");

/** The policy of a gateway sandbox whose host rules were all removed since it started: everything allowed. */
const allowAll = (): EffectiveHostPolicy => ({ rules: [], default: "allow", tools: {}, secrets: [] });

/**
 * Looks up the gateway sandbox behind a guest address: the network's plan says which sandbox and
 * its CIDR posture, the ledger its tenant, the policies its effective host policy as of now.
 */
export function gatewayLookup(
  network: Pick<HostNetwork, "byGuest" | "blocked" | "unreachable">,
  ledger: Pick<Ledger, "getSandbox">,
  policies: Pick<GatewayPolicies, "ofRow">,
): SandboxLookup {
  return {
    sandboxOf(address) {
      const hit = network.byGuest(address);
      if (!hit?.policy.gateway) return undefined;
      const row = ledger.getSandbox(hit.sandboxId);
      if (!row) return undefined;
      return {
        sandboxId: hit.sandboxId,
        tenant: row.tenant,
        allowOut: hit.policy.allowOut,
        denyOut: hit.policy.denyOut,
        internet: hit.policy.internet,
        policy: policies.ofRow(row) ?? allowAll(),
      };
    },
    blocked: () => network.blocked,
    unreachable: () => network.unreachable,
  };
}
