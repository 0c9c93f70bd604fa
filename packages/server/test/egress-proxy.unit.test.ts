/**
 * The egress proxy in process, on loopback: a client stands in for the sandbox (its source address
 * is the "guest"), a local server for the upstream, and a gate object for approvals. The netns
 * lab (egress.test.ts) covers the redirect, DNS and real guests; here: `ask` and its outcomes,
 * server stop while held, internet:false, refused sources, and the terminator hook.
 */
import { once } from "node:events";
import http, { type IncomingMessage } from "node:http";
import { connect as tcpConnect, createServer, type AddressInfo, type Server } from "node:net";
import { connect as tlsConnect } from "node:tls";
import { afterEach, describe, expect, it } from "vitest";
import type { EffectiveHostPolicy } from "@bothy/protocol";
import type {
  ApprovalAsk,
  ApprovalGate,
  ApprovalOutcome,
  GatewaySandbox,
  TerminateContext,
} from "../src/gateway/contracts.ts";
import { EgressProxy } from "../src/gateway/egress-proxy.ts";
import { gatewayLookup } from "../src/gateway/gateway-lookup.ts";
import { HostNetwork } from "../src/network/host-network.ts";
import type { ServerEvent } from "../src/events/server-events.ts";
import { loopbackDns } from "./helpers/loopback-dns.ts";

const HOST = "127.0.0.1";

/** Approvals held until the test answers them. */
class TestGate implements ApprovalGate {
  readonly grants = new Set<string>();
  private readonly waiting: Array<(a: HeldAsk) => void> = [];
  private readonly queued: HeldAsk[] = [];
  async granted(_sandboxId: string, host: string): Promise<boolean> {
    return this.grants.has(host);
  }
  ask(req: ApprovalAsk, signal: AbortSignal): Promise<ApprovalOutcome> {
    // As the ApprovalBroker does: an abort (client gone, server stopping) answers `cancelled`.
    return new Promise((resolve) => {
      const held = { req, signal, resolve };
      signal.addEventListener("abort", () => resolve({ approvalId: "apr_c", state: "cancelled" }));
      const w = this.waiting.shift();
      if (w) w(held);
      else this.queued.push(held);
    });
  }
  next(): Promise<HeldAsk> {
    const q = this.queued.shift();
    return q ? Promise.resolve(q) : new Promise((r) => this.waiting.push(r));
  }
}
interface HeldAsk {
  req: ApprovalAsk;
  signal: AbortSignal;
  resolve: (o: ApprovalOutcome) => void;
}

function policy(p: Partial<EffectiveHostPolicy>): EffectiveHostPolicy {
  return { rules: [], default: "allow", tools: {}, secrets: [], ...p };
}
const rule = (host: string, action: "allow" | "deny" | "ask", index = 0) =>
  ({ host, action, source: "sandbox", index }) as const;

interface World {
  proxy: EgressProxy;
  ports: { http: number; https: number };
  events: ServerEvent[];
  bodies: string[];
  hits: () => number;
  tlsHits: () => number;
  firstByte: () => number | undefined;
  gate: TestGate;
  /** Queries the server's resolver got. */
  dnsQueries: () => number;
}

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function world(
  sb: Partial<GatewaySandbox> | undefined,
  opts: { gate?: boolean; terminate?: (ctx: TerminateContext) => void; unreachable?: string[] } = {},
): Promise<World> {
  let hits = 0;
  const bodies: string[] = [];
  const upstream = http.createServer((req, res) => {
    hits++;
    let body = "";
    req.on("data", (d: Buffer) => (body += d.toString()));
    req.on("end", () => {
      bodies.push(body);
      res.end(JSON.stringify({ method: req.method, url: req.url, host: req.headers.host, body }));
    });
  });
  upstream.listen(0, HOST);
  await once(upstream, "listening");
  // An upstream "TLS" port: it counts connections and the bytes of the first (the replayed hello).
  let tlsHits = 0;
  const tlsUp: Server = createServer((s) => {
    tlsHits++;
    s.once("data", (d: Buffer) => {
      firstByte = d[0];
      s.destroy();
    });
  });
  let firstByte: number | undefined;
  tlsUp.listen(0, HOST);
  await once(tlsUp, "listening");
  const events: ServerEvent[] = [];
  const gate = new TestGate();
  const dns = await loopbackDns();
  const proxy = new EgressProxy({
    dns: [dns.server],
    host: HOST,
    log: (event, fields) => events.push({ event, ...fields } as ServerEvent),
    upstream: { http: (upstream.address() as AddressInfo).port, https: (tlsUp.address() as AddressInfo).port },
    ...(opts.gate === false ? {} : { gate }),
    ...(opts.terminate ? { terminate: opts.terminate } : {}),
  });
  const ports = await proxy.listen();
  const full: GatewaySandbox | undefined = sb && {
    sandboxId: "sbx_aaaaaaaaaaaaaaaaaaaa",
    tenant: "default",
    allowOut: [],
    denyOut: [],
    policy: policy({}),
    ...sb,
  };
  proxy.attach({
    sandboxOf: async (a) => (a === HOST ? full : undefined),
    blocked: () => ["10.0.0.0/8"],
    ...(opts.unreachable ? { unreachable: () => opts.unreachable ?? [] } : {}),
  });
  cleanups.push(async () => {
    await proxy.close();
    upstream.close();
    tlsUp.close();
    dns.close();
  });
  return {
    proxy,
    ports,
    events,
    bodies,
    hits: () => hits,
    tlsHits: () => tlsHits,
    firstByte: () => firstByte,
    gate,
    dnsQueries: dns.queries,
  };
}

function request(
  port: number,
  host: string,
  o: { method?: string; body?: string; signal?: AbortSignal } = {},
): Promise<{ status: number; json: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: HOST, port, method: o.method ?? "GET", path: "/x?y=1", headers: { host }, agent: false },
      (res: IncomingMessage) => {
        let b = "";
        res.on("data", (d: Buffer) => (b += d.toString()));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, json: JSON.parse(b) as Record<string, unknown> }));
      },
    );
    req.on("error", reject);
    if (o.signal) o.signal.addEventListener("abort", () => req.destroy());
    req.end(o.body);
  });
}

/** A request written byte for byte as given (no client normalises its target), and the answer. */
async function rawRequest(port: number, host: string, target: string): Promise<{ status: number; body: string }> {
  const s = tcpConnect({ host: HOST, port });
  await once(s, "connect");
  // Not ended: the answer's `connection: close` ends it.
  s.write(`GET ${target} HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
  const chunks: Buffer[] = [];
  for await (const c of s) chunks.push(c as Buffer);
  const text = Buffer.concat(chunks).toString();
  return { status: Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0), body: text.slice(text.indexOf("\r\n\r\n") + 4) };
}

describe("EgressProxy", () => {
  it("holds an ask until approved, then sends it exactly once, with its body excerpt asked", async () => {
    const w = await world({ policy: policy({ rules: [rule(HOST, "ask")] }) });
    const answer = request(w.ports.http, HOST, { method: "POST", body: "please" });
    const held = await w.gate.next();
    expect(held.req).toMatchObject({ kind: "http", method: "POST", host: HOST, path: "/x?y=1", excerpt: "please" });
    expect(w.hits()).toBe(0);
    held.resolve({ approvalId: "apr_x", state: "approved" });
    expect(await answer).toMatchObject({ status: 200, json: { method: "POST", body: "please" } });
    expect(w.hits()).toBe(1);
    expect(w.events.map((e) => [e.event, (e as { outcome?: string }).outcome])).toEqual([
      ["egress_asked", "pending"],
      ["egress_allowed", "approved"],
    ]);
  });

  it("answers 403 for a denied or expired ask, and skips asking under a host grant", async () => {
    const w = await world({ policy: policy({ rules: [rule(HOST, "ask")] }) });
    for (const state of ["denied", "expired"] as const) {
      const answer = request(w.ports.http, HOST);
      (await w.gate.next()).resolve({ approvalId: "apr_y", state });
      const r = await answer;
      expect(r.status).toBe(403);
      expect(r.json).toMatchObject({ code: "egress_denied", state, approval_id: "apr_y" });
    }
    expect(w.hits()).toBe(0);
    w.gate.grants.add(HOST);
    expect((await request(w.ports.http, HOST)).status).toBe(200);
    expect(w.events.at(-1)).toMatchObject({ event: "egress_allowed", outcome: "granted" });
  });

  it("aborts the ask when the client goes away, and answers 503 retryable when the server stops", async () => {
    const w = await world({ policy: policy({ rules: [rule(HOST, "ask")] }) });
    const gone = new AbortController();
    const first = request(w.ports.http, HOST, { signal: gone.signal }).catch((e: Error) => e);
    const held = await w.gate.next();
    gone.abort();
    await first;
    if (!held.signal.aborted) await once(held.signal, "abort");
    expect(held.signal.aborted).toBe(true);

    const second = request(w.ports.http, HOST);
    await w.gate.next();
    await w.proxy.close();
    const r = await second;
    expect(r.status).toBe(503);
    expect(r.json).toMatchObject({ code: "shutting_down", retryable: true });
    expect(w.hits()).toBe(0);
  });

  it("refuses a placeholder in a streamed plain-HTTP body, also split across chunks: the upstream never gets it whole", async () => {
    const w = await world({ policy: policy({}) });
    const answer = await new Promise<{ status: number; json: Record<string, unknown> }>((resolve, reject) => {
      const req = http.request(
        { host: HOST, port: w.ports.http, method: "POST", path: "/up", headers: { host: HOST }, agent: false },
        (res) => {
          let b = "";
          res.on("data", (d: Buffer) => (b += d.toString()));
          res.on("end", () => resolve({ status: res.statusCode ?? 0, json: JSON.parse(b) as Record<string, unknown> }));
        },
      );
      req.on("error", reject);
      req.write("token=bothy_p");
      // The second half once the first has gone through the gateway to the upstream.
      const wait = setInterval(() => {
        if (w.hits() === 0) return;
        clearInterval(wait);
        req.end("h_0123456789abcdef");
      }, 5);
    });
    expect(answer.status).toBe(403);
    expect(answer.json).toMatchObject({ code: "egress_denied", rule: "placeholder" });
    expect(w.bodies).toEqual([]);
    expect(w.events.at(-1)).toMatchObject({
      event: "egress_denied",
      rule: "placeholder",
      reason: "a placeholder in the body",
    });
  });

  it("says approvals are not available without a gate", async () => {
    const w = await world({ policy: policy({ rules: [rule(HOST, "ask")] }) }, { gate: false });
    const r = await request(w.ports.http, HOST);
    expect(r.status).toBe(403);
    expect(String(r.json["detail"])).toContain("approvals are not available");
  });

  it("under internet:false lets out only hosts an allow rule names", async () => {
    const w = await world({ internet: false, policy: policy({ rules: [rule("localhost", "allow")] }) });
    const r = await request(w.ports.http, HOST);
    expect(r.status).toBe(403);
    expect(String(r.json["detail"])).toContain("internet is off");
    const w2 = await world({ internet: false, policy: policy({ rules: [rule(HOST, "allow")] }) });
    expect((await request(w2.ports.http, HOST)).status).toBe(200);
  });

  it("under internet:false does not even look up a name no rule names (no DNS channel out)", async () => {
    const w = await world({ internet: false, policy: policy({ rules: [rule("api.example.test", "allow")] }) });
    const r = await request(w.ports.http, "c2VjcmV0.exfil.example.test");
    expect(r.status).toBe(403);
    expect(String(r.json["detail"])).toContain("was not looked up: internet is off");
    expect(w.dnsQueries()).toBe(0);
    expect(w.hits()).toBe(0);
  });

  it("refuses a blocked address even when a rule allows the host, unless allow_out names it", async () => {
    const w = await world({ policy: policy({ rules: [rule("10.1.2.3", "allow")] }) });
    const r = await request(w.ports.http, "10.1.2.3");
    expect(r.json).toMatchObject({ code: "egress_denied", rule: "address" });
    expect(String(r.json["detail"])).toContain("10.0.0.0/8");
  });

  it("never dials the host or another sandbox, even when allow_out names it", async () => {
    // The upstream listens on the host's loopback, standing in for any address of the host.
    const sb = { allowOut: ["127.0.0.0/8"], policy: policy({ rules: [rule(HOST, "allow")] }) };
    const w = await world(sb, { unreachable: ["127.0.0.0/8", "10.179.0.0/16"] });
    const r = await request(w.ports.http, HOST);
    expect(r.status).toBe(403);
    expect(r.json).toMatchObject({ code: "egress_denied", rule: "address" });
    expect(String(r.json["detail"])).toContain("the host or other sandboxes");
    expect(w.hits()).toBe(0);
  });

  it("closes connections from an address that is no gateway sandbox's", async () => {
    const w = await world(undefined);
    await expect(request(w.ports.http, HOST)).rejects.toThrow();
    const s = tcpConnect({ host: HOST, port: w.ports.https });
    await once(s, "close");
    expect(w.events).toEqual([]);
  });

  it("holds passed-through HTTPS before dialing for an ask, then replays the hello exactly once", async () => {
    const w = await world({
      policy: policy({ rules: [rule("api.example.test", "ask"), rule("no.example.test", "deny", 1)] }),
    });
    const hello = (servername: string) =>
      new Promise<string>((resolve) => {
        const c = tlsConnect({ host: HOST, port: w.ports.https, servername, rejectUnauthorized: false });
        c.on("error", (e) => resolve(e.message));
        c.on("close", () => resolve("closed"));
      });
    const done = hello("api.example.test");
    const held = await w.gate.next();
    expect(held.req).toMatchObject({ host: "api.example.test", method: null, path: null, excerpt: "" });
    expect(w.tlsHits()).toBe(0);
    held.resolve({ approvalId: "apr_t", state: "approved" });
    await done;
    expect(w.tlsHits()).toBe(1);
    expect(w.firstByte()).toBe(22);
    expect(await hello("no.example.test")).toMatch(/alert access denied/i);
    expect(w.tlsHits()).toBe(1);
  });

  it("hands a host that must be seen to the terminator, and refuses it without one", async () => {
    const seen: TerminateContext[] = [];
    const sb = { policy: policy({ secrets: ["github"], rules: [rule("api.example.test", "allow")] }) };
    const w = await world(sb, {
      terminate: (ctx) => {
        seen.push(ctx);
        ctx.socket.destroy();
      },
    });
    const hello = (port: number) =>
      new Promise<string>((resolve) => {
        const c = tlsConnect({ host: HOST, port, servername: "api.example.test", rejectUnauthorized: false });
        c.on("error", (e) => resolve(e.message));
        c.on("close", () => resolve("closed"));
      });
    await hello(w.ports.https);
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatchObject({ host: "api.example.test", sandbox: { sandboxId: "sbx_aaaaaaaaaaaaaaaaaaaa" } });
    expect(seen[0]?.peeked[0]).toBe(22);
    expect(await seen[0]!.decide("GET", "/", new AbortController().signal)).toBe("allow");
    expect(await seen[0]!.decide("GET", "/", new AbortController().signal)).toBe("allow");

    const bare = await world(sb);
    expect(await hello(bare.ports.https)).toMatch(/alert access denied/i);
    expect(bare.events.at(-1)).toMatchObject({ event: "egress_denied", rule: "terminator" });
  });

  it("judges a sandbox's path as the upstream reads it: traversal and ambiguous encodings do not leave a prefix rule", async () => {
    const mine = { host: HOST, path: "/repos/me/", action: "allow", source: "sandbox", index: 0 } as const;
    const w = await world({ policy: policy({ rules: [mine], default: "deny" }) });
    const allowed = await rawRequest(w.ports.http, HOST, "/repos/me/issues");
    expect(allowed.status).toBe(200);
    expect(w.hits()).toBe(1);
    const escapes = [
      "/repos/me/%2e%2e/%2e%2e/admin",
      "/repos/me/%2E%2E/%2E%2E/admin",
      "/repos/me/..%2f..%2fadmin",
      "/repos/me/%252e%252e/%252e%252e/admin",
      "/repos/me/..;/..;/admin",
      "/repos/me/..\\..\\admin",
      "/repos/me//../../admin",
    ];
    for (const target of escapes) {
      const r = await rawRequest(w.ports.http, HOST, target);
      expect(r.status, target).toBe(403);
      expect(JSON.parse(r.body), target).toMatchObject({
        code: "egress_denied",
        reason: "ambiguous_path",
        rule: "sandbox#0",
      });
    }
    for (const target of ["/repos/me/../../admin", "/repos/me/./../../admin"]) {
      const r = await rawRequest(w.ports.http, HOST, target);
      expect(r.status, target).toBe(403);
      expect(JSON.parse(r.body), target).toMatchObject({ code: "egress_denied" });
    }
    expect(w.hits()).toBe(1);
    expect(w.events.filter((e) => e.event === "egress_denied")).toHaveLength(escapes.length + 2);
    expect(w.events.find((e) => e.event === "egress_denied")).toMatchObject({
      rule: "sandbox#0",
      outcome: "refused",
      reason: expect.stringContaining("ambiguous path"),
    });
  });

  it("judges the path of terminated HTTPS the same way", async () => {
    const seen: TerminateContext[] = [];
    const mine = {
      host: "api.example.test",
      path: "/repos/me/",
      action: "allow",
      source: "sandbox",
      index: 0,
    } as const;
    const w = await world(
      { policy: policy({ secrets: ["github"], rules: [mine], default: "deny" }) },
      { terminate: (ctx) => void (seen.push(ctx), ctx.socket.destroy()) },
    );
    const c = tlsConnect({
      host: HOST,
      port: w.ports.https,
      servername: "api.example.test",
      rejectUnauthorized: false,
    });
    await new Promise((resolve) => {
      c.on("error", () => undefined);
      c.on("close", resolve);
    });
    const decide = (path: string) => seen[0]!.decide("GET", path, new AbortController().signal);
    expect(await decide("/repos/me/x")).toBe("allow");
    expect(await decide("/repos/me/../../admin")).toMatchObject({
      status: 403,
      body: { code: "egress_denied", reason: "ambiguous_path", rule: "sandbox#0" },
    });
    expect(await decide("/repos/me/a/../b")).toBe("allow");
    expect(await decide("/repos/me/%2e%2e/%2e%2e/admin")).toMatchObject({
      status: 403,
      body: { code: "egress_denied", reason: "ambiguous_path" },
    });
  });

  it("shows a held HTTPS request's body excerpt in its approval, as on plain HTTP", async () => {
    const seen: TerminateContext[] = [];
    const w = await world(
      { policy: policy({ secrets: ["github"], rules: [rule("api.example.test", "ask")] }) },
      { terminate: (ctx) => void (seen.push(ctx), ctx.socket.destroy()) },
    );
    const c = tlsConnect({
      host: HOST,
      port: w.ports.https,
      servername: "api.example.test",
      rejectUnauthorized: false,
    });
    await new Promise((resolve) => {
      c.on("error", () => undefined);
      c.on("close", resolve);
    });
    let reads = 0;
    const excerpt = async (): Promise<Buffer> => (reads++, Buffer.from("please merge #12"));
    const verdict = seen[0]!.decide("POST", "/repos/me/pulls", new AbortController().signal, excerpt);
    const held = await w.gate.next();
    expect(held.req).toMatchObject({
      kind: "http",
      method: "POST",
      path: "/repos/me/pulls",
      excerpt: "please merge #12",
    });
    held.resolve({ approvalId: "apr_h", state: "approved" });
    expect(await verdict).toBe("allow");
    // Under a host grant nothing waits for a person: the body is not read ahead.
    w.gate.grants.add("api.example.test");
    expect(await seen[0]!.decide("POST", "/x", new AbortController().signal, excerpt)).toBe("allow");
    expect(reads).toBe(1);
  });

  it("knows a sandbox by its guest address only while it has a subnet, and only under the gateway", async () => {
    const net = new HostNetwork({
      tag: "k3x9",
      sandboxesDir: "/nonexistent",
      pool: "10.179.0.0/16",
      uplink: "eth0",
      dns: [],
      extraBlocked: ["198.51.100.0/24"],
      log: () => undefined,
    });
    const gated = net.allocate("sbx_aaaaaaaaaaaaaaaaaaaa", "veth", {
      internet: true,
      allowOut: ["10.200.0.10/32"],
      denyOut: [],
      gateway: true,
    });
    const plain = net.allocate("sbx_bbbbbbbbbbbbbbbbbbbb", "tap", { internet: true, allowOut: [], denyOut: [] });
    const rows = new Map([
      ["sbx_aaaaaaaaaaaaaaaaaaaa", { tenant: "t1", policy: null }],
      ["sbx_bbbbbbbbbbbbbbbbbbbb", { tenant: "t1", policy: null }],
    ]);
    const lookup = gatewayLookup(
      net,
      { getSandbox: async (id: string) => rows.get(id) as never },
      { ofRow: async () => policy({ default: "deny" }) },
    );
    expect(await lookup.sandboxOf(gated.guest.guest)).toMatchObject({
      sandboxId: "sbx_aaaaaaaaaaaaaaaaaaaa",
      tenant: "t1",
      allowOut: ["10.200.0.10/32"],
      policy: { default: "deny" },
    });
    expect((await lookup.sandboxOf(`::ffff:${gated.guest.guest}`))?.sandboxId).toBe("sbx_aaaaaaaaaaaaaaaaaaaa");
    // Its gateway address, another sandbox without the gateway, an address outside the pool.
    expect(await lookup.sandboxOf(gated.guest.gateway)).toBeUndefined();
    expect(await lookup.sandboxOf(plain.guest.guest)).toBeUndefined();
    expect(await lookup.sandboxOf("203.0.113.5")).toBeUndefined();
    expect(lookup.blocked()).toEqual(expect.arrayContaining(["10.0.0.0/8", "10.179.0.0/16", "198.51.100.0/24"]));
    // Whatever allow_out says: loopback, the pool, and the host's own addresses (its loopback's at least).
    expect(lookup.unreachable?.()).toEqual(
      expect.arrayContaining(["0.0.0.0/8", "127.0.0.0/8", "10.179.0.0/16", "127.0.0.1/32"]),
    );
  });
});
