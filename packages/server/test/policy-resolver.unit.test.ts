/**
 * The policy resolver from a sandbox's side: what its queries get back, and whether a name it
 * may not reach is ever passed on upstream (a lookup is a channel out). Real UDP on loopback: the
 * "sandbox" is a node:dns Resolver, the upstream a counting fake that answers every name.
 */
import { createSocket } from "node:dgram";
import { Resolver } from "node:dns/promises";
import { once } from "node:events";
import { afterEach, describe, expect, it } from "vitest";
import type { EffectiveHostPolicy } from "@bothy/protocol";
import type { GatewaySandbox } from "../src/gateway/contracts.ts";
import { answer, parseQuery, RCODE } from "../src/network/dns-message.ts";
import { PolicyResolver, resolvable } from "../src/network/policy-resolver.ts";

const HOST = "127.0.0.1";
const ANSWER = "203.0.113.77";

function policy(p: Partial<EffectiveHostPolicy>): EffectiveHostPolicy {
  return { rules: [], default: "allow", tools: {}, secrets: [], ...p };
}
const rule = (host: string, action: "allow" | "deny" | "ask", extra: Record<string, unknown> = {}) =>
  ({ host, action, source: "sandbox", index: 0, ...extra }) as EffectiveHostPolicy["rules"][number];

/** An upstream that answers every A query with ANSWER and remembers the names it was asked. */
async function upstream(): Promise<{ server: string; asked: string[]; close: () => void }> {
  const sock = createSocket("udp4");
  const asked: string[] = [];
  sock.on("message", (msg, from) => {
    const q = parseQuery(msg);
    if (!q) return;
    asked.push(q.name);
    sock.send(answer(q, RCODE.noError, [ANSWER], 30), from.port, from.address);
  });
  sock.bind(0, HOST);
  await once(sock, "listening");
  return { server: `${HOST}:${sock.address().port}`, asked, close: () => sock.close() };
}

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function world(sb: Partial<GatewaySandbox>) {
  const up = await upstream();
  const resolver = new PolicyResolver({ dns: [up.server], host: HOST });
  const port = await resolver.listen();
  const full: GatewaySandbox = {
    sandboxId: "sbx_aaaaaaaaaaaaaaaaaaaa",
    tenant: "default",
    allowOut: [],
    denyOut: [],
    policy: policy({}),
    ...sb,
  };
  resolver.attach({ sandboxOf: async (a) => (a === HOST ? full : undefined), blocked: () => [] });
  cleanups.push(() => resolver.close(), up.close);
  // The sandbox's own stub resolver, pointed at the address nft would redirect it to.
  const stub = new Resolver({ timeout: 2000, tries: 1 });
  stub.setServers([`${HOST}:${port}`]);
  const outcome = (p: Promise<unknown>) =>
    p.then(
      (v) => ({ ok: v }),
      (e: { code?: string }) => ({ err: e.code }),
    );
  return {
    up,
    a: (name: string) => outcome(stub.resolve4(name)),
    aaaa: (name: string) => outcome(stub.resolve6(name)),
  };
}

describe("policy resolver", () => {
  it("under internet:false answers the names allow_hosts permits and refuses the rest without asking upstream", async () => {
    const w = await world({
      internet: false,
      policy: policy({ rules: [rule("api.example.test", "allow"), rule("*.svc.example.test", "ask")] }),
    });
    expect(await w.a("api.example.test")).toEqual({ ok: [ANSWER] });
    expect(await w.a("API.Example.Test")).toEqual({ ok: [ANSWER] });
    expect(await w.a("a.svc.example.test")).toEqual({ ok: [ANSWER] });
    // No IPv6 for sandboxes: a permitted name has no AAAA.
    expect(await w.aaaa("api.example.test")).toEqual({ err: "ENODATA" });
    for (const name of ["c2VjcmV0.exfil.example.test", "example.test", "svc.example.test"])
      expect(await w.a(name), name).toEqual({ err: "EREFUSED" });
    expect(w.up.asked).toEqual(["api.example.test", "a.svc.example.test"]);
  });

  it("with the internet on, refuses only what the policy denies", async () => {
    const w = await world({ policy: policy({ rules: [rule("blocked.example.test", "deny")] }) });
    expect(await w.a("any.example.test")).toEqual({ ok: [ANSWER] });
    expect(await w.a("blocked.example.test")).toEqual({ err: "EREFUSED" });
    const closed = await world({ policy: policy({ default: "deny", rules: [rule("ok.example.test", "allow")] }) });
    expect(await closed.a("ok.example.test")).toEqual({ ok: [ANSWER] });
    expect(await closed.a("other.example.test")).toEqual({ err: "EREFUSED" });
    expect(closed.up.asked).toEqual(["ok.example.test"]);
  });

  it("judges a name by the rules that could let HTTP(S) to it out", () => {
    const sb = (rules: EffectiveHostPolicy["rules"], internet = false) => ({ policy: policy({ rules }), internet });
    // A rule with a method or path may still let a request out: the name resolves.
    expect(
      resolvable(sb([rule("api.example.test", "allow", { methods: ["GET"], path: "/repos/" })]), "api.example.test"),
    ).toBe(true);
    // A deny first wins over a later allow.
    expect(resolvable(sb([rule("x.example.test", "deny"), rule("*.example.test", "allow")]), "x.example.test")).toBe(
      false,
    );
    expect(resolvable(sb([], true), "anything.test")).toBe(true);
    expect(resolvable(sb([]), "anything.test")).toBe(false);
  });

  it("reads only plain queries with one question", () => {
    const query = (name: string, flags = 0x0100) => {
      const labels = name.split(".").map((l) => Buffer.concat([Buffer.from([l.length]), Buffer.from(l, "latin1")]));
      const head = Buffer.alloc(12);
      head.writeUInt16BE(0x1234, 0);
      head.writeUInt16BE(flags, 2);
      head.writeUInt16BE(1, 4);
      return Buffer.concat([head, ...labels, Buffer.from([0, 0, 1, 0, 1])]);
    };
    expect(parseQuery(query("api.example.test"))).toMatchObject({ id: 0x1234, name: "api.example.test", type: 1 });
    expect(parseQuery(query("api.example.test", 0x8100))).toBeUndefined(); // a response
    expect(parseQuery(query("a b.example.test"))).toBeUndefined(); // not a host name
    expect(
      parseQuery(Buffer.concat([query("x.test").subarray(0, 12), Buffer.from([0xc0, 0x0c, 0, 1, 0, 1])])),
    ).toBeUndefined();
    expect(
      parseQuery(query(`${"a".repeat(63)}.${"b".repeat(63)}.${"c".repeat(63)}.${"d".repeat(63)}`)),
    ).toBeUndefined();
    expect(parseQuery(Buffer.alloc(600))).toBeUndefined();
  });
});
