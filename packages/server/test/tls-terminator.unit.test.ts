/**
 * The terminator over loopback: a sandbox-side client (HTTP/1.1, HTTP/2, WebSocket) trusting
 * bothy's egress CA talks through it to an HTTPS echo server whose certificate a separate test CA
 * signed, which the terminator verifies.
 */
import { mkdtemp, rm } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import { createServer as createHttpsServer, request as httpsRequest, type Server } from "node:https";
import { connect as http2Connect } from "node:http2";
import { type AddressInfo, type Server as NetServer } from "node:net";
import { createSecureContext } from "node:tls";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { brotliCompressSync, deflateSync, gzipSync } from "node:zlib";
import { once } from "node:events";
import WebSocket, { WebSocketServer } from "ws";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EgressCa } from "../src/gateway/egress-ca.ts";
import type { SecretBinding, SecretSource } from "../src/gateway/contracts.ts";
import type { SecretReport, Verdict } from "../src/gateway/tls-terminator.ts";
import { recoverable } from "./helpers/echo-leaks.ts";
import { terminatorListener } from "./helpers/terminator-listener.ts";

const GITHUB_VALUE = "ghp_Real+Value/with space&=";
const STRIPE_VALUE = "sk_live_stripe_value_42";
const GITHUB_PH = "bothy_ph_githubgithubgithubgithubgithub23";
const STRIPE_PH = "bothy_ph_stripestripestripestripestripe22";
const API = "api.example.test";
const PAY = "api.pay.test";
/** Terminated (the sandbox has secrets) but bound to none of them. */
const FREE = "ws.example.test";

const bindings: SecretBinding[] = [
  { name: "github", env: "GITHUB", placeholder: GITHUB_PH, hosts: [API], inject: null },
  {
    name: "stripe",
    env: "STRIPE",
    placeholder: STRIPE_PH,
    hosts: ["*.pay.test"],
    inject: { header: "X-Api-Key", format: "key {value}" },
  },
];
const source: SecretSource = {
  bindings: async () => bindings,
  reveal: async (_tenant, name) => Buffer.from(name === "github" ? GITHUB_VALUE : STRIPE_VALUE),
};

/**
 * An upstream that gives the request's Authorization header back in ways the gateway did not
 * ask for: base64 of the whole header, in a response header too, and compressed although the
 * request asked for identity (`/hostile/<codings>`, comma-separated, applied in order; `te-gzip`
 * is a transfer coding, `fake-gzip` declares gzip and sends the bytes as they are).
 */
function hostile(url: string, method: string, auth: string, res: ServerResponse, range?: string): void {
  const plain = `b64=${Buffer.from(auth).toString("base64")};b64url=${Buffer.from(auth).toString("base64url")};header=${auth};`;
  const codings = url
    .slice("/hostile/".length)
    .split(",")
    .filter((c) => c !== "" && c !== "plain");
  let body = Buffer.from(plain);
  for (const c of codings)
    body =
      c === "gzip"
        ? gzipSync(body)
        : c === "deflate"
          ? deflateSync(body)
          : c === "br"
            ? brotliCompressSync(body)
            : c === "te-gzip"
              ? gzipSync(body)
              : body;
  const headers: Record<string, string> = {
    "content-type": "text/plain",
    "x-echo-b64": Buffer.from(auth).toString("base64"),
  };
  // `fake-gzip`: declared gzip, sent as it is; other names are declared as they are.
  // A value that is a token is also a valid header name: echoed as one.
  const token = auth.split(" ").pop() ?? "";
  if (/^[A-Za-z0-9_.+-]+$/.test(token)) headers[`x-echo-${token}`] = "1";
  const content = codings.filter((c) => c !== "te-gzip").map((c) => (c === "fake-gzip" ? "gzip" : c));
  if (content.length > 0) headers["content-encoding"] = content.join(", ");
  if (codings.includes("te-gzip")) headers["transfer-encoding"] = "gzip, chunked";
  // `range: bytes=A-B` is honoured on the plain echo: a slice that may cut a value in two.
  const slice = /^bytes=(\d+)-(\d+)$/.exec(range ?? "");
  if (slice && codings.length === 0) {
    const [from, to] = [Number(slice[1]), Number(slice[2])];
    res.writeHead(206, { ...headers, "content-range": `bytes ${from}-${to}/${body.length}` });
    return void res.end(body.subarray(from, to + 1));
  }
  res.writeHead(200, headers);
  if (method === "HEAD") return void res.end();
  // In small pieces, so encoded values straddle chunks.
  for (let i = 0; i < body.length; i += 7) res.write(body.subarray(i, i + 7));
  res.end();
}

let dir: string;
let egress: EgressCa;
let upstreamCa: EgressCa;
let upstream: Server;
let upstreamPort: number;
const hits: Array<{ host: string; url: string; headers: Record<string, unknown>; body: string }> = [];
const gateways: NetServer[] = [];
const reports: SecretReport[] = [];
let verdict: Verdict = "allow";
/** While set, every decision reads the body's excerpt first, as an approval does. */
let peekExcerpts = false;
const excerpts: string[] = [];

/** A gateway listener for one SNI host, the way the proxy will hand connections over. */
async function gateway(host: string): Promise<number> {
  const { server, port } = await terminatorListener({
    host,
    port: upstreamPort,
    tenant: "default",
    bindings,
    secrets: source,
    leaves: egress,
    dial: async () => "127.0.0.1",
    decide: async (_method, _path, _signal, excerpt) => {
      if (peekExcerpts && excerpt) excerpts.push((await excerpt()).toString());
      return verdict;
    },
    report: (ev) => reports.push(ev),
    upstreamCa: upstreamCa.caPem,
  });
  gateways.push(server);
  return port;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "bothy-term-"));
  egress = await EgressCa.open(join(dir, "egress"));
  upstreamCa = await EgressCa.open(join(dir, "upstream"));
  const contexts = new Map<string, ReturnType<typeof createSecureContext>>();
  for (const host of [API, PAY, FREE]) contexts.set(host, createSecureContext(await upstreamCa.leafFor(host)));
  upstream = createHttpsServer(
    { SNICallback: (name, cb) => cb(null, contexts.get(name)), ALPNProtocols: ["http/1.1"] },
    (req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const body = Buffer.concat(chunks).toString();
        const host = (req.socket as unknown as { servername: string }).servername;
        hits.push({ host, url: req.url ?? "", headers: req.headers, body });
        const auth = String(req.headers.authorization ?? req.headers["x-api-key"] ?? "");
        if (req.url?.startsWith("/hostile/"))
          return hostile(req.url, req.method ?? "GET", auth, res, req.headers.range);
        const secret = auth.replace(/^(token|key|Bearer) /, "");
        // The value echoed in three forms, written in small pieces so they straddle chunks.
        const echo = `raw=${secret};b64=${Buffer.from(secret).toString("base64")};url=${encodeURIComponent(secret)};`;
        res.writeHead(200, {
          "content-type": "text/plain",
          "x-echo": secret,
          "content-length": Buffer.byteLength(echo),
        });
        const bytes = Buffer.from(echo);
        for (let i = 0; i < bytes.length; i += 5) res.write(bytes.subarray(i, i + 5));
        res.end();
      });
    },
  );
  const wss = new WebSocketServer({ server: upstream });
  wss.on("connection", (ws, req) => {
    ws.send(`auth=${String(req.headers.authorization)}`);
    ws.on("message", (m) => ws.send(`echo:${String(m)}`));
  });
  upstream.listen(0, "127.0.0.1");
  await once(upstream, "listening");
  upstreamPort = (upstream.address() as AddressInfo).port;
});

afterAll(async () => {
  for (const g of gateways) g.close();
  upstream.closeAllConnections();
  upstream.close();
  await rm(dir, { recursive: true, force: true });
});

function get1(
  port: number,
  host: string,
  path: string,
  headers: Record<string, string>,
  body?: string,
  method = body ? "POST" : "GET",
): Promise<{ status: number; headers: Record<string, unknown>; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpsRequest(
      {
        host: "127.0.0.1",
        port,
        servername: host,
        path,
        method,
        headers,
        ca: egress.caPem,
        agent: false,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }),
        );
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

describe("TLS terminator", () => {
  it("swaps a bound placeholder in over HTTP/1.1 and scrubs the echoed value in every form", async () => {
    const port = await gateway(API);
    hits.length = 0;
    const res = await get1(port, API, "/user", { authorization: `token ${GITHUB_PH}`, "accept-encoding": "gzip" });
    expect(res.status).toBe(200);
    expect(hits).toHaveLength(1);
    expect(hits[0]?.host).toBe(API);
    expect(hits[0]?.headers.authorization).toBe(`token ${GITHUB_VALUE}`);
    expect(hits[0]?.headers["accept-encoding"]).toBe("identity");
    expect(hits[0]?.headers.host).toBe(`${API}:${upstreamPort}`);
    expect(res.body).toBe(`raw=${GITHUB_PH};b64=${GITHUB_PH};url=${GITHUB_PH};`);
    expect(res.headers["x-echo"]).toBe(GITHUB_PH);
    expect(JSON.stringify(res)).not.toContain("ghp_Real");
    expect(reports).toContainEqual({
      kind: "secret_injected",
      secret: "github",
      host: API,
      method: "GET",
      path: "/user",
    });
  });

  it("refuses a placeholder sent to a host it is not bound to, in a header, the URL or the body", async () => {
    const port = await gateway(API);
    hits.length = 0;
    reports.length = 0;
    for (const attempt of [
      () => get1(port, API, "/", { "x-key": STRIPE_PH }),
      () => get1(port, API, `/?k=${STRIPE_PH}`, {}),
      () => get1(port, API, "/upload", { "content-type": "text/plain" }, `${"a".repeat(100_000)}${STRIPE_PH}tail`),
    ]) {
      const res = await attempt();
      expect(res.status).toBe(403);
      expect(JSON.parse(res.body)).toMatchObject({ code: "secret_refused", secrets: ["stripe"], host: API });
      expect(res.body).not.toContain(STRIPE_VALUE);
    }
    expect(hits.filter((h) => h.url !== "/upload")).toHaveLength(0);
    expect(hits.some((h) => h.body.includes(STRIPE_PH) || h.body.includes(STRIPE_VALUE))).toBe(false);
    expect(reports.filter((r) => r.kind === "secret_refused").map((r) => r.secret)).toEqual([
      "stripe",
      "stripe",
      "stripe",
    ]);
  });

  it("injects a header over HTTP/2 and scrubs the answer", async () => {
    const port = await gateway(PAY);
    hits.length = 0;
    const session = http2Connect(`https://127.0.0.1:${port}`, { ca: egress.caPem, servername: PAY });
    try {
      const stream = session.request({ ":path": "/charges", ":method": "GET" }, { endStream: true });
      const [headers] = (await once(stream, "response")) as [Record<string, unknown>];
      const chunks: Buffer[] = [];
      for await (const c of stream) chunks.push(c as Buffer);
      expect(headers[":status"]).toBe(200);
      expect(hits[0]?.headers["x-api-key"]).toBe(`key ${STRIPE_VALUE}`);
      expect(Buffer.concat(chunks).toString()).toBe(`raw=${STRIPE_PH};b64=${STRIPE_PH};url=${STRIPE_PH};`);
      expect(headers["x-echo"]).toBe(STRIPE_PH);
    } finally {
      session.close();
    }
  });

  it("answers what the policy decides instead of going upstream", async () => {
    const port = await gateway(API);
    hits.length = 0;
    verdict = { status: 403, body: { code: "egress_denied", detail: "no" } };
    try {
      const res = await get1(port, API, "/", {});
      expect(res.status).toBe(403);
      expect(JSON.parse(res.body)).toEqual({ code: "egress_denied", detail: "no" });
      expect(hits).toHaveLength(0);
    } finally {
      verdict = "allow";
    }
  });

  it("reads a held request's body excerpt for the approval and still sends the whole body on (HTTP/1.1 and HTTP/2)", async () => {
    const port = await gateway(API);
    peekExcerpts = true;
    try {
      const large = `${"x".repeat(20_000)}|${"y".repeat(50_000)}`;
      for (const body of ["please merge", large]) {
        hits.length = 0;
        excerpts.length = 0;
        const res = await get1(port, API, "/pulls", { "content-type": "text/plain" }, body);
        expect(res.status).toBe(200);
        expect(excerpts).toEqual([body.slice(0, 8192)]);
        expect(hits[0]?.body).toBe(body);
      }
      hits.length = 0;
      excerpts.length = 0;
      const session = http2Connect(`https://127.0.0.1:${port}`, { ca: egress.caPem, servername: API });
      try {
        const stream = session.request({ ":path": "/pulls", ":method": "POST" });
        stream.end(large);
        const [headers] = (await once(stream, "response")) as [Record<string, unknown>];
        for await (const _ of stream) void _;
        expect(headers[":status"]).toBe(200);
      } finally {
        session.close();
      }
      expect(excerpts).toEqual([large.slice(0, 8192)]);
      expect(hits[0]?.body).toBe(large);
    } finally {
      peekExcerpts = false;
    }
  });

  it("refuses a WebSocket to a bound host, whose frames it would not scan, and passes one elsewhere", async () => {
    const bound = await gateway(API);
    const options = { ca: egress.caPem, servername: API, headers: { authorization: `token ${GITHUB_PH}` } };
    const refused = new WebSocket(`wss://127.0.0.1:${bound}/ws`, options as WebSocket.ClientOptions);
    const [, res] = (await once(refused, "unexpected-response")) as [unknown, IncomingMessage];
    let body = "";
    for await (const d of res) body += String(d);
    expect(res.statusCode).toBe(403);
    expect(JSON.parse(body)).toMatchObject({ code: "egress_denied", reason: "upgrade_on_bound_host", host: API });
    expect(body).not.toContain(GITHUB_VALUE);
    refused.on("error", () => undefined);
    refused.terminate();

    const free = await gateway(FREE);
    const ws = new WebSocket(`wss://127.0.0.1:${free}/ws`, {
      ca: egress.caPem,
      servername: FREE,
    } as WebSocket.ClientOptions);
    const messages: string[] = [];
    ws.on("message", (m) => messages.push(String(m)));
    await once(ws, "open");
    ws.send("hello");
    while (messages.length < 2) await once(ws, "message");
    ws.close();
    expect(messages).toEqual(["auth=undefined", "echo:hello"]);
  });

  it("gives nothing of a value back that the upstream echoes as base64 of the whole header (token, Bearer, Basic)", async () => {
    const port = await gateway(API);
    const forms = [
      `token ${GITHUB_PH}`,
      `Bearer ${GITHUB_PH}`,
      // The gateway builds these Basic credentials itself, as base64(user:<value>).
      ...["x-access-token", "u", "ab"].map((u) => `Basic ${Buffer.from(`${u}:${GITHUB_PH}`).toString("base64")}`),
    ];
    for (const authorization of forms) {
      hits.length = 0;
      const res = await get1(port, API, "/hostile/plain", { authorization });
      expect(res.status).toBe(200);
      expect(JSON.stringify(hits[0]?.headers)).not.toContain(GITHUB_PH);
      const seen = `${res.body}\n${String(res.headers["x-echo-b64"])}`;
      expect(recoverable(seen, GITHUB_VALUE, GITHUB_PH), authorization).toEqual([]);
      expect(res.body).toContain(GITHUB_PH);
    }
  });

  it("asks for no byte range, so an echo cannot come back in slices that cut the value", async () => {
    const port = await gateway(API);
    hits.length = 0;
    const pieces: string[] = [];
    for (const [from, to] of [
      [0, 24],
      [25, 49],
      [50, 74],
    ] as const) {
      const res = await get1(port, API, "/hostile/plain", {
        authorization: `token ${GITHUB_PH}`,
        range: `bytes=${from}-${to}`,
      });
      expect(res.status).toBe(200);
      pieces.push(res.body);
    }
    expect(hits.map((h) => h.headers.range)).toEqual([undefined, undefined, undefined]);
    expect(recoverable(pieces.join(""), GITHUB_VALUE, GITHUB_PH)).toEqual([]);
  });

  it("scrubs a value an upstream echoes as a response header's name", async () => {
    const port = await gateway(PAY);
    const res = await get1(port, PAY, "/hostile/plain", {});
    expect(res.status).toBe(200);
    expect(Object.keys(res.headers)).toContain(`x-echo-${STRIPE_PH}`);
    expect(recoverable(JSON.stringify(res), STRIPE_VALUE, STRIPE_PH)).toEqual([]);
  });

  it("decodes a response compressed although identity was asked (gzip, deflate, br, stacked, transfer-coded) and scrubs it", async () => {
    const port = await gateway(API);
    for (const codings of ["gzip", "deflate", "br", "gzip,br", "te-gzip", "br,te-gzip"]) {
      const res = await get1(port, API, `/hostile/${codings}`, { authorization: `token ${GITHUB_PH}` });
      expect(res.status, codings).toBe(200);
      expect(res.headers["content-encoding"], codings).toBeUndefined();
      expect(res.body, codings).toContain(`header=token ${GITHUB_PH};`);
      expect(recoverable(res.body, GITHUB_VALUE, GITHUB_PH), codings).toEqual([]);
    }
    const head = await get1(port, API, "/hostile/gzip", { authorization: `token ${GITHUB_PH}` }, undefined, "HEAD");
    expect(head.status).toBe(200);
    expect(head.headers["content-encoding"]).toBeUndefined();
  });

  it("refuses a response in an encoding it cannot decode, and ends one that does not decode, passing none of it", async () => {
    const port = await gateway(API);
    const res = await get1(port, API, "/hostile/zstd", { authorization: `token ${GITHUB_PH}` });
    expect(res.status).toBe(502);
    expect(res.headers["content-type"]).toBe("application/problem+json");
    expect(JSON.parse(res.body)).toMatchObject({ code: "upstream_failed", encoding: "zstd" });
    expect(res.body).not.toContain("ghp_Real");
    // Declared gzip, but the bytes are not: the response ends without them.
    const broken = await get1(port, API, "/hostile/fake-gzip", { authorization: `token ${GITHUB_PH}` }).catch(
      (err: Error) => ({ status: 0, headers: {}, body: err.message }),
    );
    expect(broken.body).not.toContain("b64=");
    expect(recoverable(broken.body, GITHUB_VALUE, GITHUB_PH)).toEqual([]);
  });

  it("ends a connection whose client does not trust the leaf without going upstream", async () => {
    const port = await gateway(API);
    hits.length = 0;
    await expect(
      new Promise((resolve, reject) => {
        const req = httpsRequest({ host: "127.0.0.1", port, servername: API, path: "/", agent: false }, resolve);
        req.on("error", reject);
        req.end();
      }),
    ).rejects.toThrow(/self-signed|unable to verify|certificate/i);
    expect(hits).toHaveLength(0);
  });
});
