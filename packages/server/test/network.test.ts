/**
 * Network isolation end to end, on every driver, against a world the test builds itself
 * (helpers/net-topology.ts): the real `bothy serve` runs inside a namespace whose only uplink
 * leads to a namespace playing the internet. Nothing here sends a packet off this machine.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { SandboxCreateOptions } from "@bothy/sdk";
import { api, createSandbox, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { ipv4Of, probe, sandboxNetwork, type Outcome } from "./helpers/net-probe.ts";
import type { ServeProcess } from "./helpers/serve-process.ts";
import {
  HOST_LAN_ADDR,
  HOST_PORT,
  HOST_UPLINK_ADDR,
  NetTopology,
  PRIVATE_HOST,
  PRIVATE_HOST_2,
  PUBLIC_DNS,
  PUBLIC_HTTP,
  TEST_ANSWER,
  TEST_NAME,
} from "./helpers/net-topology.ts";

const root = process.getuid?.() === 0;
const drivers = testDrivers();

/** Refused by the filter: an error, quickly (a reset or an ICMP reject, never a timeout). */
function refusedFast(o: Outcome | undefined, what: string): void {
  expect(o, what).toBeDefined();
  expect(o?.ok, `${what} should be blocked: ${JSON.stringify(o)}`).toBe(false);
  expect(o?.err, `${what} should fail fast, not time out: ${JSON.stringify(o)}`).not.toBe("timeout");
  expect(o?.ms ?? Infinity, `${what} took ${o?.ms} ms`).toBeLessThan(2000);
}

function unanswered(o: Outcome | undefined, what: string): void {
  expect(o?.ok, `${what} should not answer: ${JSON.stringify(o)}`).toBe(false);
}

describe.skipIf(!root)("network isolation", () => {
  const topo = new NetTopology();
  let server: ServeProcess | undefined;
  let home = "";
  let base = "";
  let logs: Array<Record<string, unknown>> = [];
  const made: string[] = [];

  beforeAll(async () => {
    home = await mkdtemp("/tmp/bothy-net-");
    await topo.create();
    server = topo.serveInHost(home, { BOTHY_DRIVER: "gvisor" });
    logs = server.logs;
    base = await server.url;
  });

  afterAll(async () => {
    try {
      for (const id of made) await api(base, "DELETE", `/sandboxes/${id}`).catch(() => undefined);
      await server?.stop();
    } finally {
      await topo.destroy();
      await rm(home, { recursive: true, force: true });
    }
  });

  it("enables forwarding and installs its table in the server's namespace", async () => {
    expect(logs.find((l) => l["event"] === "network_ready")).toMatchObject({
      uplink: expect.stringMatching(/u0$/),
      dns: [PUBLIC_DNS],
    });
    expect((await topo.inHost("cat", ["/proc/sys/net/ipv4/ip_forward"])).trim()).toBe("1");
  });

  describe.each(drivers)("$name", (d) => {
    it.skipIf(d.missing !== undefined)(
      driverTitle(
        d,
        "public answers; private, host, peer, metadata and IPv6 fail fast; DNS only public; internet:false and allow_out",
      ),
      async () => {
        const create = async (body: SandboxCreateOptions = {}) => {
          const id = await createSandbox(base, { driver: d.name, ...body });
          made.push(id);
          return id;
        };
        const [a, peer, closed, allowed] = await Promise.all([
          create(),
          create(),
          create({ network: { internet: false } }),
          create({ network: { allowOut: [PRIVATE_HOST], denyOut: ["203.0.113.0/24"] } }),
        ]);
        expect(await sandboxNetwork(base, a)).toEqual({
          enabled: true,
          internet: true,
          allow_out: [],
          deny_out: [],
          dns: [PUBLIC_DNS],
        });
        expect(await sandboxNetwork(base, closed)).toMatchObject({ internet: false });
        expect(await sandboxNetwork(base, allowed)).toMatchObject({
          internet: true,
          allow_out: [`${PRIVATE_HOST}/32`],
          deny_out: ["203.0.113.0/24"],
        });

        // The peer listens on a port; it reaches its own listener, so a refusal from `a` is the filter.
        await runCommand(
          base.replace(/^http/, "ws"),
          peer,
          { cmd: "node -e \"require('net').createServer((s) => s.end('peer')).listen(8080)\"", background: true },
          { onEvent: (ev, ws) => ev.type === "started" && ws.close() },
        );
        let self = await probe(base, peer, { own: { tcp: ["127.0.0.1", 8080] } });
        for (let i = 0; i < 20 && !self.results["own"]?.ok; i++)
          self = await probe(base, peer, { own: { tcp: ["127.0.0.1", 8080] } });
        const peerAddr = ipv4Of(self);
        expect(self.results["own"]?.ok).toBe(true);

        const p = await probe(base, a, {
          public: { get: [PUBLIC_HTTP, 80] },
          private: { tcp: [PRIVATE_HOST, 80] },
          hostUplink: { tcp: [HOST_UPLINK_ADDR, HOST_PORT] },
          hostLan: { tcp: [HOST_LAN_ADDR, HOST_PORT] },
          hostControl: { tcp: [topo.ctlHostAddr, HOST_PORT] },
          hostApi: { tcp: [topo.ctlHostAddr, Number(new URL(base).port)] },
          peer: { tcp: [peerAddr, 8080] },
          metadata: { tcp: ["169.254.169.254", 80] },
          ipv6: { tcp: ["2001:db8::10", 80] },
          dnsPublic: { dns: [PUBLIC_DNS, TEST_NAME] },
          dnsSystem: { lookup: TEST_NAME },
          dnsHostUplink: { dns: [HOST_UPLINK_ADDR, TEST_NAME] },
          dnsHostLan: { dns: [HOST_LAN_ADDR, TEST_NAME] },
          dnsPrivate: { dns: [PRIVATE_HOST, TEST_NAME] },
        });
        const own = ipv4Of(p);
        const gateway = own.replace(/\d+$/, (n) => String(Number(n) - 1));
        const gw = await probe(base, a, { gateway: { tcp: [gateway, HOST_PORT] } });
        expect(
          p.addrs.filter((x) => x.family === "IPv6" || x.family === 6),
          "no IPv6 address in the guest",
        ).toEqual([]);
        expect(p.resolv).toContain(`nameserver ${PUBLIC_DNS}`);
        expect(p.results["public"], JSON.stringify(p.results["public"])).toMatchObject({ ok: true, body: "OK wan\n" });
        for (const k of ["private", "hostUplink", "hostLan", "hostControl", "hostApi", "peer", "metadata", "ipv6"])
          refusedFast(p.results[k], k);
        refusedFast(gw.results["gateway"], "gateway");
        expect(p.results["dnsPublic"]).toMatchObject({ ok: true, addrs: [TEST_ANSWER] });
        expect(p.results["dnsSystem"]).toMatchObject({ ok: true, addrs: [TEST_ANSWER] });
        for (const k of ["dnsHostUplink", "dnsHostLan", "dnsPrivate"]) unanswered(p.results[k], k);

        const c = await probe(base, closed, {
          public: { get: [PUBLIC_HTTP, 80] },
          dns: { dns: [PUBLIC_DNS, TEST_NAME] },
        });
        refusedFast(c.results["public"], "public with internet:false");
        unanswered(c.results["dns"], "DNS with internet:false");

        const o = await probe(base, allowed, {
          named: { get: [PRIVATE_HOST, 80] },
          unnamed: { tcp: [PRIVATE_HOST_2, 80] },
          denied: { tcp: [PUBLIC_HTTP, 80] },
          dns: { dns: [PUBLIC_DNS, TEST_NAME] },
        });
        expect(o.results["named"], JSON.stringify(o.results["named"])).toMatchObject({ ok: true, body: "OK lan\n" });
        refusedFast(o.results["unnamed"], "a private host allow_out does not name");
        refusedFast(o.results["denied"], "a deny_out destination");
        expect(o.results["dns"]).toMatchObject({ ok: true });

        const ids = [a, peer, closed, allowed];
        for (const id of ids) expect((await api(base, "DELETE", `/sandboxes/${id}`)).status).toBe(200);
        const left = await topo.bothyObjects();
        const suffixes = ids.map((id) => id.slice(4, 16));
        expect(left.netns.filter((n) => suffixes.some((s) => n.includes(s)))).toEqual([]);
        expect(left.links.filter((n) => suffixes.some((s) => n.endsWith(s)))).toEqual([]);
        expect(left.chains.filter((c2) => ids.includes(c2))).toEqual([]);
      },
      600_000,
    );
  });

  describe.each(drivers)("$name", (d) => {
    it.skipIf(d.missing !== undefined)(
      driverTitle(d, "a sandbox keeps its network and its rules across a crash of the server"),
      async () => {
        const id = await createSandbox(base, { driver: d.name });
        made.push(id);
        const before = await probe(base, id, { public: { get: [PUBLIC_HTTP, 80] } });
        expect(before.results["public"]).toMatchObject({ ok: true });
        const child = server?.child;
        const gone = new Promise((r) => child?.once("exit", r));
        child?.kill("SIGKILL");
        await gone;
        server = topo.serveInHost(home, { BOTHY_DRIVER: "gvisor" });
        logs = server.logs;
        base = await server.url;
        expect(
          logs.find((l) => l["event"] === "sandbox_reattached" && l["sandbox_id"] === id),
          JSON.stringify(logs.filter((l) => l["sandbox_id"] === id)),
        ).toBeDefined();
        expect((await api(base, "GET", `/sandboxes/${id}`)).json["state"]).toBe("running");
        const after = await probe(base, id, {
          public: { get: [PUBLIC_HTTP, 80] },
          private: { tcp: [PRIVATE_HOST, 80] },
        });
        expect(ipv4Of(after)).toBe(ipv4Of(before));
        expect(after.results["public"]).toMatchObject({ ok: true, body: "OK wan\n" });
        refusedFast(after.results["private"], "private after the restart");
        expect((await api(base, "DELETE", `/sandboxes/${id}`)).status).toBe(200);
      },
      600_000,
    );
  });

  it("leaves no namespace, interface, chain or map element once every sandbox is gone", async () => {
    for (const id of made) await api(base, "DELETE", `/sandboxes/${id}`);
    expect(await topo.bothyObjects()).toEqual({ netns: [], links: [], chains: [], mapElements: 0 });
  });
});
