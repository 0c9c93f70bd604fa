/**
 * Request smuggling and upgrade joins through the egress gateway, from the sandbox's side: the
 * attacker writes raw bytes (or HTTP/2 frames) to the gateway on loopback, and the upstream is a
 * Node server that keeps connections alive, accepts pipelined requests and logs every request it
 * parses, with its body and the connection it came on. Whatever the framing, the upstream must
 * parse only requests the gateway judged, and a secret's value must reach no request body (the
 * only place an attacker's bytes could carry it back).
 *
 * The terminated HTTPS path (tls-terminator.ts, a secret bound to the host) and the plain-HTTP
 * path (egress-proxy.ts) are both covered; egress.test.ts repeats the chunked GET from a gVisor guest.
 */
import { once } from "node:events";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import { connect as http2Connect, type ClientHttp2Session } from "node:http2";
import { createServer as createHttpsServer } from "node:https";
import { mkdtemp, rm } from "node:fs/promises";
import { connect as tcpConnect, type AddressInfo, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect as tlsConnect, createSecureContext } from "node:tls";
import type { Duplex } from "node:stream";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { EffectiveHostPolicy } from "@bothy/protocol";
import { EgressCa } from "../src/gateway/egress-ca.ts";
import type { GatewaySandbox, SecretBinding, SecretSource } from "../src/gateway/contracts.ts";
import { EgressProxy } from "../src/gateway/egress-proxy.ts";
import type { SecretReport } from "../src/gateway/tls-terminator.ts";
import type { ServerEvent } from "../src/events/server-events.ts";
import { loopbackDns } from "./helpers/loopback-dns.ts";
import { terminatorListener } from "./helpers/terminator-listener.ts";

const LOOP = "127.0.0.1";
const API = "api.example.test";
/** A host the sandbox's HTTPS is terminated for (it has secrets) that no secret is bound to. */
const PLAIN = "plain.example.test";
const DENIED = "denied.example.test";
const VALUE = "ghp_RealValue0123456789abcdef";
const PH = "bothy_ph_githubgithubgithubgithubgithub23";
const bindings: SecretBinding[] = [{ name: "github", env: "GITHUB", placeholder: PH, hosts: [API], inject: null }];
const source: SecretSource = { bindings: async () => bindings, reveal: async () => Buffer.from(VALUE) };

/** One request as the upstream's parser saw it: `conn` numbers the connection it came on. */
interface Parsed {
  conn: number;
  method: string;
  url: string;
  host: string;
  authorization: string | null;
  body: string;
}

/**
 * A keep-alive upstream that parses pipelined requests and logs each (the log is complete once
 * the request's body ended). An upgrade request is logged too, then `accept`ed (101, and its
 * bytes echoed) or `decline`d: answered 200 while the connection stays HTTP, so what follows it
 * is parsed as the next request, as a server that ignores `Upgrade` may do (RFC 9110 7.8).
 */
function pipeliningUpstream(log: Parsed[], upgrades: "accept" | "decline") {
  const conns = new WeakMap<object, number>();
  let next = 0;
  const handle = (req: IncomingMessage, res: ServerResponse): void => {
    const conn = conns.get(req.socket) ?? ++next;
    conns.set(req.socket, conn);
    let body = "";
    req.on("data", (d: Buffer) => (body += d.toString("latin1")));
    req.on("end", () => {
      log.push({
        conn,
        method: req.method ?? "",
        url: req.url ?? "",
        host: req.headers.host ?? "",
        authorization: req.headers.authorization ?? null,
        body,
      });
      res.end(JSON.stringify({ url: req.url, body: body.length }));
    });
  };
  /** `reparse` hands the connection back to the server's HTTP parser. */
  const onUpgrade = (req: IncomingMessage, socket: Duplex, head: Buffer, reparse: () => void): void => {
    const conn = ++next;
    conns.set(socket, conn);
    log.push({
      conn,
      method: req.method ?? "",
      url: req.url ?? "",
      host: req.headers.host ?? "",
      authorization: req.headers.authorization ?? null,
      body: "",
    });
    if (upgrades === "decline") {
      socket.write("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nno");
      if (head.length > 0) socket.unshift(head);
      return reparse();
    }
    socket.write("HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\r\n");
    if (head.length > 0) socket.write(head);
    socket.pipe(socket);
  };
  return { handle, onUpgrade };
}

/** Raw bytes to a gateway and what comes back, read as text. */
class RawClient {
  text = "";
  closed = false;
  private readonly waiters: Array<() => void> = [];
  constructor(readonly socket: Duplex) {
    socket.on("data", (d: Buffer) => {
      this.text += d.toString("latin1");
      this.wake();
    });
    socket.on("error", () => undefined);
    socket.on("close", () => {
      this.closed = true;
      this.wake();
    });
  }
  send(bytes: string): void {
    this.socket.write(bytes);
  }
  /** Status lines received so far. */
  statuses(): number[] {
    return [...this.text.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => Number(m[1]));
  }
  /** Resolves once `n` answers came or the connection closed; a 10 s deadline fails it. */
  async answers(n: number): Promise<number[]> {
    await this.until(`${n} answers`, () => this.statuses().length >= n || this.closed);
    return this.statuses();
  }
  async closedOrAfter(): Promise<void> {
    await this.until("the close", () => this.closed);
  }
  private async until(what: string, ok: () => boolean): Promise<void> {
    const deadline = Date.now() + 10_000;
    while (!ok()) {
      if (Date.now() > deadline) throw new Error(`no ${what} in time; got ${JSON.stringify(this.text)}`);
      // Woken by data or the close; the timer only bounds each wait.
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setTimeout(r, 200);
      });
    }
  }
  private wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }
}

/** A chunked body holding `inner` whole. */
const chunked = (inner: string): string => `${Buffer.byteLength(inner).toString(16)}\r\n${inner}\r\n0\r\n\r\n`;

/**
 * The request an attacker hides in a body: a POST whose Content-Length reaches into whatever the
 * upstream reads next on that connection, to have the next request's headers (the swapped-in
 * secret) as its body.
 */
const SMUGGLED = (host: string, swallow = 90): string =>
  `POST /smuggled HTTP/1.1\r\nHost: ${host}\r\nContent-Length: ${swallow}\r\n\r\n`;

async function pollUntil(what: string, ok: () => boolean): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

function problemIn(text: string): Record<string, unknown> {
  const start = text.indexOf("{");
  return JSON.parse(text.slice(start, text.indexOf("}", start) + 1)) as Record<string, unknown>;
}

// ---- the terminated HTTPS path --------------------------------------------------------------------

describe("TLS terminator framing", { timeout: 30_000 }, () => {
  let dir: string;
  let egress: EgressCa;
  let upstreamCa: EgressCa;
  const log: Parsed[] = [];
  /** Every request the terminator asked the policy about. */
  const judged: string[] = [];
  const reports: SecretReport[] = [];
  const closers: Array<() => void> = [];
  let upstreamPort = 0;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "bothy-smuggle-"));
    egress = await EgressCa.open(join(dir, "egress"));
    upstreamCa = await EgressCa.open(join(dir, "upstream"));
    const contexts = new Map<string, ReturnType<typeof createSecureContext>>();
    for (const host of [API, PLAIN]) contexts.set(host, createSecureContext(await upstreamCa.leafFor(host)));
    const up = pipeliningUpstream(log, "decline");
    const server = createHttpsServer(
      { SNICallback: (name, cb) => cb(null, contexts.get(name)), ALPNProtocols: ["http/1.1"] },
      up.handle,
    );
    server.on("upgrade", (req: IncomingMessage, socket: Duplex, head: Buffer) =>
      up.onUpgrade(req, socket, head, () => server.emit("secureConnection", socket)),
    );
    server.listen(0, LOOP);
    await once(server, "listening");
    upstreamPort = (server.address() as AddressInfo).port;
    closers.push(() => {
      server.closeAllConnections();
      server.close();
    });
  });

  afterAll(async () => {
    for (const c of closers) c();
    await rm(dir, { recursive: true, force: true });
  });

  afterEach(() => {
    log.length = 0;
    judged.length = 0;
    reports.length = 0;
  });

  /** A gateway listener for one SNI host, handing connections over as the proxy does. */
  async function gateway(host: string): Promise<number> {
    const { server, port } = await terminatorListener(
      {
        host,
        port: upstreamPort,
        tenant: "default",
        bindings,
        secrets: source,
        leaves: egress,
        dial: async () => LOOP,
        decide: async (method, path) => {
          judged.push(`${method} ${path}`);
          return "allow";
        },
        report: (ev) => reports.push(ev),
        upstreamCa: upstreamCa.caPem,
      },
      LOOP,
    );
    closers.push(() => server.close());
    return port;
  }

  async function rawTls(port: number, host: string): Promise<RawClient> {
    const socket = tlsConnect({ host: LOOP, port, servername: host, ca: egress.caPem, ALPNProtocols: ["http/1.1"] });
    await once(socket, "secureConnect");
    return new RawClient(socket);
  }

  /** The upstream parsed only what was judged, and no body it read holds the value. */
  function expectOnlyJudged(): void {
    for (const p of log) expect(judged, `the upstream parsed ${p.method} ${p.url}`).toContain(`${p.method} ${p.url}`);
    expect(log.filter((p) => p.body.includes(VALUE))).toEqual([]);
    expect(log.map((p) => p.url)).not.toContain("/smuggled");
  }

  it("refuses a chunked GET whose body hides a request; the next request on the connection is judged on its own", async () => {
    const port = await gateway(API);
    const c = await rawTls(port, API);
    c.send(
      `GET /first HTTP/1.1\r\nHost: ${API}\r\nAuthorization: token ${PH}\r\nTransfer-Encoding: chunked\r\n\r\n${chunked(SMUGGLED(API))}`,
    );
    await c.answers(1);
    // The victim: the sandbox's next request, whose header carries the secret once swapped in.
    c.send(`GET /next HTTP/1.1\r\nHost: ${API}\r\nAuthorization: token ${PH}\r\n\r\n`);
    await c.answers(2);
    await pollUntil("the upstream's log of the next request", () =>
      log.some((p) => p.url === "/next" || p.url === "/smuggled"),
    );
    expectOnlyJudged();
    expect(log.map((p) => [p.method, p.url, p.authorization])).toEqual([["GET", "/next", `token ${VALUE}`]]);
    expect(c.statuses()).toEqual([400, 200]);
    expect(problemIn(c.text)).toMatchObject({ code: "malformed_request" });
    c.socket.destroy();
  });

  it("frames a chunked POST's body as a body: the request inside it stays data", async () => {
    const port = await gateway(API);
    const c = await rawTls(port, API);
    c.send(
      `POST /upload HTTP/1.1\r\nHost: ${API}\r\nAuthorization: token ${PH}\r\nTransfer-Encoding: chunked\r\n\r\n${chunked(SMUGGLED(API))}`,
    );
    expect(await c.answers(1)).toEqual([200]);
    c.send(`GET /next HTTP/1.1\r\nHost: ${API}\r\nAuthorization: token ${PH}\r\n\r\n`);
    expect(await c.answers(2)).toEqual([200, 200]);
    await pollUntil("the upstream's log of /next", () => log.some((p) => p.url === "/next"));
    expect(log.map((p) => [p.method, p.url])).toEqual([
      ["POST", "/upload"],
      ["GET", "/next"],
    ]);
    expect(log[0]?.body).toBe(SMUGGLED(API));
    // The re-chunked body went on a connection of its own, closed after it.
    expect(log[0]?.conn).not.toBe(log[1]?.conn);
    expectOnlyJudged();
    c.socket.destroy();
  });

  it("never reuses an upstream connection after a body on a method that rarely has one", async () => {
    const port = await gateway(API);
    const c = await rawTls(port, API);
    const body = SMUGGLED(API);
    c.send(`DELETE /thing HTTP/1.1\r\nHost: ${API}\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    expect(await c.answers(1)).toEqual([200]);
    c.send(`GET /next HTTP/1.1\r\nHost: ${API}\r\nAuthorization: token ${PH}\r\n\r\n`);
    expect(await c.answers(2)).toEqual([200, 200]);
    await pollUntil("the upstream's log of /next", () => log.some((p) => p.url === "/next"));
    const [del, next] = log;
    expect(del).toMatchObject({ method: "DELETE", body });
    // The next request, with the secret in it, did not go on the DELETE's connection.
    expect(next).toMatchObject({ url: "/next", authorization: `token ${VALUE}` });
    expect(next?.conn).not.toBe(del?.conn);
    expectOnlyJudged();
    c.socket.destroy();
  });

  it("answers each framing Node's parser or the gateway refuses with a 400 problem, and sends nothing", async () => {
    const port = await gateway(API);
    const attempts = [
      // Both length headers.
      `POST /a HTTP/1.1\r\nHost: ${API}\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n${chunked(SMUGGLED(API))}`,
      // Two Content-Lengths that disagree, and two that agree.
      `POST /b HTTP/1.1\r\nHost: ${API}\r\nContent-Length: 4\r\nContent-Length: 90\r\n\r\nabcd${SMUGGLED(API)}`,
      `POST /c HTTP/1.1\r\nHost: ${API}\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nabcd`,
      // A transfer coding the gateway cannot vouch for.
      `POST /d HTTP/1.1\r\nHost: ${API}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n${chunked("x")}`,
      // A body on GET, by length.
      `GET /e HTTP/1.1\r\nHost: ${API}\r\nContent-Length: 90\r\n\r\n${SMUGGLED(API)}`,
      // An absolute URL naming another host than the one judged.
      `GET http://${DENIED}/f HTTP/1.1\r\nHost: ${API}\r\n\r\n`,
    ];
    for (const attempt of attempts) {
      const c = await rawTls(port, API);
      c.send(attempt);
      expect(await c.answers(1), attempt).toEqual([400]);
      expect(problemIn(c.text), attempt).toMatchObject({ status: 400, code: "malformed_request" });
      c.socket.destroy();
    }
    expect(log).toEqual([]);
    expectOnlyJudged();
  });

  it("refuses HTTP/2 DATA on a GET, and the session's next request carries nothing of it", async () => {
    const port = await gateway(API);
    const session: ClientHttp2Session = http2Connect(`https://${LOOP}:${port}`, { ca: egress.caPem, servername: API });
    try {
      const get = session.request(
        { ":method": "GET", ":path": "/h2-first", authorization: `token ${PH}` },
        { endStream: false },
      );
      get.end(SMUGGLED(API));
      const [headers] = (await once(get, "response")) as [Record<string, unknown>];
      let text = "";
      for await (const d of get) text += String(d);

      const next = session.request({ ":method": "GET", ":path": "/h2-next", authorization: `token ${PH}` });
      const [nextHeaders] = (await once(next, "response")) as [Record<string, unknown>];
      for await (const _ of next) void _;
      await pollUntil("the upstream's log of the next request", () =>
        log.some((p) => p.url === "/h2-next" || p.url === "/smuggled"),
      );
      expectOnlyJudged();
      expect(log.filter((p) => p.url !== "/h2-first").map((p) => [p.method, p.url, p.body])).toEqual([
        ["GET", "/h2-next", ""],
      ]);
      expect(headers[":status"]).toBe(400);
      expect(JSON.parse(text)).toMatchObject({ code: "malformed_request" });
      expect(nextHeaders[":status"]).toBe(200);
    } finally {
      session.close();
    }
  });

  it("frames HTTP/2 DATA of unknown length on a POST as a chunked body", async () => {
    const port = await gateway(API);
    const session = http2Connect(`https://${LOOP}:${port}`, { ca: egress.caPem, servername: API });
    try {
      const post = session.request({ ":method": "POST", ":path": "/h2-post" }, { endStream: false });
      post.write("part one;");
      post.end(SMUGGLED(API));
      const [headers] = (await once(post, "response")) as [Record<string, unknown>];
      for await (const _ of post) void _;
      expect(headers[":status"]).toBe(200);
      await pollUntil("the upstream's log of /h2-post", () => log.some((p) => p.url === "/h2-post"));
      expect(log.map((p) => [p.method, p.url, p.body])).toEqual([["POST", "/h2-post", `part one;${SMUGGLED(API)}`]]);
      expectOnlyJudged();
    } finally {
      session.close();
    }
  });

  it("refuses an upgrade to a host a secret is bound to: its frames would not be scanned", async () => {
    const port = await gateway(API);
    const c = await rawTls(port, API);
    c.send(
      `GET /ws HTTP/1.1\r\nHost: ${API}\r\nAuthorization: token ${PH}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`,
    );
    expect(await c.answers(1)).toEqual([403]);
    await c.closedOrAfter();
    expect(problemIn(c.text)).toMatchObject({ code: "egress_denied", host: API, reason: "upgrade_on_bound_host" });
    expect(c.text).not.toContain(VALUE);
    expect(log).toEqual([]);
    expect(reports).toContainEqual({ kind: "secret_refused", secret: "github", host: API, method: "GET", path: "/ws" });
  });

  it("joins an upgrade only after a 101: another answer is relayed and ends the connection, pipelined bytes unsent", async () => {
    const port = await gateway(PLAIN);
    const c = await rawTls(port, PLAIN);
    c.send(
      `GET /ws HTTP/1.1\r\nHost: ${PLAIN}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nGET /after HTTP/1.1\r\nHost: ${PLAIN}\r\n\r\n`,
    );
    await c.closedOrAfter();
    expect(c.statuses()).toEqual([200]);
    expect(log.map((p) => [p.method, p.url])).toEqual([["GET", "/ws"]]);
    expectOnlyJudged();
  });
});

// ---- the plain-HTTP path ----------------------------------------------------------------------------

describe("plain-HTTP proxy framing", { timeout: 30_000 }, () => {
  const cleanups: Array<() => Promise<void> | void> = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });

  const policy = (): EffectiveHostPolicy => ({
    rules: [
      { host: API, action: "allow", source: "sandbox", index: 0 },
      { host: DENIED, action: "deny", source: "sandbox", index: 1 },
    ],
    default: "deny",
    tools: {},
    secrets: [],
  });

  /** The proxy with one gateway sandbox (loopback), names resolving to loopback, and a logging upstream. */
  async function world(upgrades: "accept" | "decline" = "decline") {
    const log: Parsed[] = [];
    const up = pipeliningUpstream(log, upgrades);
    const upstream = http.createServer(up.handle);
    upstream.on("upgrade", (req: IncomingMessage, socket: Duplex, head: Buffer) =>
      up.onUpgrade(req, socket, head, () => upstream.emit("connection", socket)),
    );
    upstream.listen(0, LOOP);
    await once(upstream, "listening");
    const events: ServerEvent[] = [];
    const dns = await loopbackDns();
    const proxy = new EgressProxy({
      dns: [dns.server],
      host: LOOP,
      log: (event, fields) => events.push({ event, ...fields } as ServerEvent),
      upstream: { http: (upstream.address() as AddressInfo).port, https: 1 },
    });
    const ports = await proxy.listen();
    const sb: GatewaySandbox = {
      sandboxId: "sbx_aaaaaaaaaaaaaaaaaaaa",
      tenant: "default",
      allowOut: [],
      denyOut: [],
      policy: policy(),
    };
    proxy.attach({ sandboxOf: async (a) => (a === LOOP ? sb : undefined), blocked: () => ["10.0.0.0/8"] });
    cleanups.push(async () => {
      await proxy.close();
      upstream.closeAllConnections();
      upstream.close();
      dns.close();
    });
    const judged = (): string[] =>
      events
        .filter((e) => e.event === "egress_allowed")
        .map((e) => {
          const f = e as unknown as { method: string; path: string; host: string };
          return `${f.method} ${f.host}${f.path}`;
        });
    /** The upstream parsed only requests the proxy allowed (the judged path has its query cut). */
    const expectOnlyJudged = async (): Promise<void> => {
      await pollUntil("the audit of every parsed request", () => judged().length >= log.length);
      for (const p of log)
        expect(judged(), `the upstream parsed ${p.method} ${p.host}${p.url}`).toContain(
          `${p.method} ${p.host.replace(/:\d+$/, "")}${p.url.split("?")[0]}`,
        );
      expect(log.map((p) => p.url)).not.toContain("/smuggled");
      expect(log.map((p) => p.host)).not.toContain(DENIED);
    };
    const raw = async (): Promise<RawClient> => {
      const s: Socket = tcpConnect({ host: LOOP, port: ports.http });
      await once(s, "connect");
      cleanups.push(() => void s.destroy());
      return new RawClient(s);
    };
    return { log, events, raw, expectOnlyJudged };
  }

  it("refuses a chunked GET hiding a request; another connection's request is not swallowed", async () => {
    const w = await world();
    const attacker = await w.raw();
    attacker.send(
      `GET /first HTTP/1.1\r\nHost: ${API}\r\nTransfer-Encoding: chunked\r\n\r\n${chunked(SMUGGLED(API, 30))}`,
    );
    await attacker.answers(1);
    // Another connection (another sandbox could be behind the same upstream pool).
    const victim = await w.raw();
    victim.send(`GET /next HTTP/1.1\r\nHost: ${API}\r\nX-Victim: yes\r\n\r\n`);
    await victim.answers(1);
    await pollUntil("the upstream's log of the next request", () =>
      w.log.some((p) => p.url === "/next" || p.url === "/smuggled"),
    );
    await w.expectOnlyJudged();
    expect(w.log.map((p) => [p.method, p.url])).toEqual([["GET", "/next"]]);
    expect(attacker.statuses()).toEqual([400]);
    expect(problemIn(attacker.text)).toMatchObject({ code: "malformed_request" });
    expect(victim.statuses()).toEqual([200]);
  });

  it("frames a DELETE's counted body on a connection of its own, and a chunked POST as chunked", async () => {
    const w = await world();
    const c = await w.raw();
    const body = SMUGGLED(API);
    c.send(`DELETE /thing HTTP/1.1\r\nHost: ${API}\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    expect(await c.answers(1)).toEqual([200]);
    c.send(`POST /up HTTP/1.1\r\nHost: ${API}\r\nTransfer-Encoding: chunked\r\n\r\n${chunked(body)}`);
    expect(await c.answers(2)).toEqual([200, 200]);
    const victim = await w.raw();
    victim.send(`GET /next HTTP/1.1\r\nHost: ${API}\r\n\r\n`);
    expect(await victim.answers(1)).toEqual([200]);
    await pollUntil("the upstream's log of /next", () => w.log.some((p) => p.url === "/next"));
    expect(w.log.map((p) => [p.method, p.url, p.body])).toEqual([
      ["DELETE", "/thing", body],
      ["POST", "/up", body],
      ["GET", "/next", ""],
    ]);
    expect(new Set(w.log.map((p) => p.conn)).size).toBe(3);
    await w.expectOnlyJudged();
  });

  it("answers a framing the parser refuses with a 400 problem and closes", async () => {
    const w = await world();
    for (const attempt of [
      `POST /a HTTP/1.1\r\nHost: ${API}\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n${chunked(SMUGGLED(API))}`,
      `POST /b HTTP/1.1\r\nHost: ${API}\r\nContent-Length: 4\r\nContent-Length: 90\r\n\r\nabcd${SMUGGLED(API)}`,
      `POST /d HTTP/1.1\r\nHost: ${API}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n${chunked("x")}`,
      `GET http://${DENIED}/f HTTP/1.1\r\nHost: ${API}\r\n\r\n`,
    ]) {
      const c = await w.raw();
      c.send(attempt);
      expect(await c.answers(1), attempt).toEqual([400]);
      expect(problemIn(c.text), attempt).toMatchObject({ status: 400, code: "malformed_request" });
      await c.closedOrAfter();
    }
    expect(w.log).toEqual([]);
  });

  it("joins an upgrade only after a 101: a 200 is relayed, the connection ends, the pipelined request never goes", async () => {
    const w = await world();
    const c = await w.raw();
    c.send(
      `GET /ws HTTP/1.1\r\nHost: ${API}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nGET /hidden HTTP/1.1\r\nHost: ${DENIED}\r\n\r\n`,
    );
    await c.closedOrAfter();
    expect(c.statuses()).toEqual([200]);
    expect(w.log.map((p) => [p.method, p.url])).toEqual([["GET", "/ws"]]);
    await w.expectOnlyJudged();
  });

  it("joins an upgrade the upstream accepts with a 101, and refuses one with a body", async () => {
    const w = await world("accept");
    const c = await w.raw();
    c.send(`GET /ws HTTP/1.1\r\nHost: ${API}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nping`);
    await pollUntil("the echo after the 101", () => c.text.endsWith("ping"));
    expect(c.statuses()).toEqual([101]);
    c.send("pong");
    await pollUntil("the second echo", () => c.text.endsWith("pingpong"));

    const bodied = await w.raw();
    bodied.send(
      `POST /ws HTTP/1.1\r\nHost: ${API}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 90\r\n\r\n${SMUGGLED(API)}`,
    );
    expect(await bodied.answers(1)).toEqual([400]);
    expect(problemIn(bodied.text)).toMatchObject({ code: "malformed_request" });
    expect(w.log.map((p) => [p.method, p.url])).toEqual([["GET", "/ws"]]);
  });
});
