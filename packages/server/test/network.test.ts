/**
 * Network isolation end to end, on every driver, against a world the test builds itself
 * (helpers/net-topology.ts): the real `bothy serve` runs inside a namespace whose only uplink
 * leads to a namespace playing the internet. Nothing here sends a packet off this machine.
 */
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { join } from "node:path";
import { hostTag, ifaceName } from "../src/util/host-names.ts";
import { describe, expect, it } from "vitest";
import type { SandboxCreateOptions } from "@bothy/sdk";
import { api, createSandbox, deleteSandbox, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useNetLab } from "./helpers/net-lab.ts";
import { ipv4Of, probe, sandboxNetwork, type Outcome, type ProbeResult } from "./helpers/net-probe.ts";
import type { ServeProcess } from "./helpers/serve-process.ts";
import {
  HOST_LAN_ADDR,
  HOST_PORT,
  HOST_UPLINK_ADDR,
  PRIVATE_HOST,
  PRIVATE_HOST_2,
  PUBLIC_DNS,
  PUBLIC_HTTP,
  sh,
  TEST_ANSWER,
  TEST_NAME,
} from "./helpers/net-topology.ts";

const root = process.getuid?.() === 0;
const drivers = testDrivers();

/**
 * Refused by the filter: an error (a reset or an ICMP reject), never the probe's timeout. How long
 * the refusal took is not asserted: under emulation on a loaded host it can take seconds.
 */
function refusedFast(o: Outcome | undefined, what: string): void {
  expect(o, what).toBeDefined();
  expect(o?.ok, `${what} should be blocked: ${JSON.stringify(o)}`).toBe(false);
  expect(o?.err, `${what} should fail fast, not time out: ${JSON.stringify(o)}`).not.toBe("timeout");
}

function unanswered(o: Outcome | undefined, what: string): void {
  expect(o?.ok, `${what} should not answer: ${JSON.stringify(o)}`).toBe(false);
}

describe.skipIf(!root)("network isolation", () => {
  // The one private host `allow_out` names below is within the operator's ceiling.
  const lab = useNetLab("net", () => ({ BOTHY_ALLOW_OUT_PERMIT: PRIVATE_HOST }));
  const { topo, made } = lab;

  it("enables forwarding and installs its table in the server's namespace", async () => {
    expect(lab.server.logs.find((l) => l["event"] === "network_ready")).toMatchObject({
      uplink: expect.stringMatching(/u0$/),
      dns: [PUBLIC_DNS],
    });
    expect((await topo.inHost("cat", ["/proc/sys/net/ipv4/ip_forward"])).trim()).toBe("1");
  });

  describe.each(drivers)("$name", (d) => {
    /** The main test's first sandbox, kept for the crash test: one boot less (a VM's is costly). */
    let kept = "";
    /** Nothing of these sandboxes is left on the host: namespace, interface or chain. */
    const expectNetworkGone = async (ids: string[]): Promise<void> => {
      const left = await topo.bothyObjects();
      const suffixes = ids.map((id) => id.slice(4, 12));
      expect(left.netns.filter((n) => suffixes.some((s) => n.includes(s)))).toEqual([]);
      expect(left.links.filter((n) => suffixes.some((s) => n.endsWith(s)))).toEqual([]);
      expect(left.chains.filter((c2) => ids.includes(c2))).toEqual([]);
    };

    it.skipIf(d.missing !== undefined)(
      driverTitle(
        d,
        "public answers; private, host, peer, metadata and IPv6 fail fast; DNS only public; internet:false and allow_out",
      ),
      async () => {
        const create = async (body: SandboxCreateOptions = {}) => {
          const id = await createSandbox(lab.base, { driver: d.name, ...body });
          made.push(id);
          return id;
        };
        // The peer is only a target: a's own chain is what refuses it, so it is the cheaper gVisor
        // sandbox where there is one (a VM boot under emulation would add nothing).
        const [a, peer, closed, allowed] = await Promise.all([
          create(),
          create(drivers.some((x) => x.name === "gvisor") ? { driver: "gvisor" } : {}),
          create({ network: { internet: false } }),
          create({ network: { allowOut: [PRIVATE_HOST], denyOut: ["203.0.113.0/24"] } }),
        ]);
        expect(await sandboxNetwork(lab.base, a)).toEqual({
          enabled: true,
          internet: true,
          allow_out: [],
          deny_out: [],
          dns: [PUBLIC_DNS],
        });
        expect(await sandboxNetwork(lab.base, closed)).toMatchObject({ internet: false });
        expect(await sandboxNetwork(lab.base, allowed)).toMatchObject({
          internet: true,
          allow_out: [`${PRIVATE_HOST}/32`],
          deny_out: ["203.0.113.0/24"],
        });

        // The peer listens on a port; it reaches its own listener, so a refusal from `a` is the filter.
        await runCommand(
          lab.base.replace(/^http/, "ws"),
          peer,
          { cmd: "node -e \"require('net').createServer((s) => s.end('peer')).listen(8080)\"", background: true },
          { onEvent: (ev, ws) => ev.type === "started" && ws.close() },
        );
        let self = await probe(lab.base, peer, { own: { tcp: ["127.0.0.1", 8080] } });
        for (let i = 0; i < 20 && !self.results["own"]?.ok; i++)
          self = await probe(lab.base, peer, { own: { tcp: ["127.0.0.1", 8080] } });
        const peerAddr = ipv4Of(self);
        expect(self.results["own"]?.ok).toBe(true);

        const p = await probe(lab.base, a, {
          public: { get: [PUBLIC_HTTP, 80] },
          private: { tcp: [PRIVATE_HOST, 80] },
          hostUplink: { tcp: [HOST_UPLINK_ADDR, HOST_PORT] },
          hostLan: { tcp: [HOST_LAN_ADDR, HOST_PORT] },
          hostControl: { tcp: [topo.ctlHostAddr, HOST_PORT] },
          hostApi: { tcp: [topo.ctlHostAddr, Number(new URL(lab.base).port)] },
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
        const gw = await probe(lab.base, a, { gateway: { tcp: [gateway, HOST_PORT] } });
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

        const c = await probe(lab.base, closed, {
          public: { get: [PUBLIC_HTTP, 80] },
          dns: { dns: [PUBLIC_DNS, TEST_NAME] },
        });
        refusedFast(c.results["public"], "public with internet:false");
        unanswered(c.results["dns"], "DNS with internet:false");

        const o = await probe(lab.base, allowed, {
          named: { get: [PRIVATE_HOST, 80] },
          unnamed: { tcp: [PRIVATE_HOST_2, 80] },
          denied: { tcp: [PUBLIC_HTTP, 80] },
          dns: { dns: [PUBLIC_DNS, TEST_NAME] },
        });
        expect(o.results["named"], JSON.stringify(o.results["named"])).toMatchObject({ ok: true, body: "OK lan\n" });
        refusedFast(o.results["unnamed"], "a private host allow_out does not name");
        refusedFast(o.results["denied"], "a deny_out destination");
        expect(o.results["dns"]).toMatchObject({ ok: true });

        // `a` goes on to the crash test, which deletes it and checks the same.
        const ids = [peer, closed, allowed];
        for (const id of ids) expect(await deleteSandbox(lab.base, id)).toBe("deleted");
        await expectNetworkGone(ids);
        kept = a;
      },
      600_000,
    );

    it.skipIf(d.missing !== undefined)(
      driverTitle(
        d,
        "a fork's children each get their own address and rules (QEMU: resumed from memory that held the parent's address); the parent keeps its own",
      ),
      async () => {
        // The main test's sandbox when it ran (one boot less); its own otherwise.
        const own = kept === "";
        const parent = own ? await createSandbox(lab.base, { driver: d.name }) : kept;
        if (own) made.push(parent);
        const before = await probe(lab.base, parent, { public: { get: [PUBLIC_HTTP, 80] } });
        expect(before.results["public"]).toMatchObject({ ok: true });
        // On QEMU with memory: each child resumes the parent's guest, eth0 configured as the parent's.
        const fork = await api(lab.base, "POST", `/sandboxes/${parent}/fork`, {
          count: 2,
          ...(d.name === "qemu" ? { memory: true } : {}),
        });
        expect(fork.status, JSON.stringify(fork.json)).toBe(201);
        const children = (fork.json["sandboxes"] as Array<{ sandbox_id: string }>).map((x) => x.sandbox_id);
        made.push(...children);
        // One after another: three emulated VMs starting Node at once take minutes on a loaded host.
        const seen: ProbeResult[] = [];
        for (const id of [parent, ...children])
          seen.push(
            await probe(lab.base, id, { public: { get: [PUBLIC_HTTP, 80] }, private: { tcp: [PRIVATE_HOST, 80] } }),
          );
        const addrs = seen.map((p) => ipv4Of(p));
        expect(addrs[0], "the parent keeps its address").toBe(ipv4Of(before));
        expect(new Set(addrs).size, `one address each: ${addrs.join(", ")}`).toBe(3);
        for (const [i, p] of seen.entries()) {
          // Only an address the host gave that sandbox's interface gets through its rules.
          expect(p.results["public"], `public from ${addrs[i]}`).toMatchObject({ ok: true, body: "OK wan\n" });
          refusedFast(p.results["private"], `private from ${addrs[i]}`);
        }
        for (const id of children) expect(await deleteSandbox(lab.base, id)).toBe("deleted");
        await expectNetworkGone(children);
        const snapshot = String((fork.json["snapshot"] as { snapshot_id: string }).snapshot_id);
        expect((await api(lab.base, "DELETE", `/snapshots/${snapshot}`)).status).toBe(200);
        if (own) expect(await deleteSandbox(lab.base, parent)).toBe("deleted");
      },
      600_000,
    );

    it.skipIf(d.missing !== undefined)(
      driverTitle(d, "a sandbox keeps its network and its rules across a crash of the server"),
      async () => {
        const id = kept || (await createSandbox(lab.base, { driver: d.name }));
        made.push(id);
        const before = await probe(lab.base, id, { public: { get: [PUBLIC_HTTP, 80] } });
        expect(before.results["public"]).toMatchObject({ ok: true });
        await lab.restart("kill");
        const logs = lab.server.logs;
        expect(
          logs.find((l) => l["event"] === "sandbox_reattached" && l["sandbox_id"] === id),
          JSON.stringify(logs.filter((l) => l["sandbox_id"] === id)),
        ).toBeDefined();
        expect((await api(lab.base, "GET", `/sandboxes/${id}`)).json["state"]).toBe("running");
        const after = await probe(lab.base, id, {
          public: { get: [PUBLIC_HTTP, 80] },
          private: { tcp: [PRIVATE_HOST, 80] },
        });
        expect(ipv4Of(after)).toBe(ipv4Of(before));
        expect(after.results["public"]).toMatchObject({ ok: true, body: "OK wan\n" });
        refusedFast(after.results["private"], "private after the restart");
        expect(await deleteSandbox(lab.base, id)).toBe("deleted");
        await expectNetworkGone([id]);
      },
      600_000,
    );
  });

  it.skipIf(drivers.find((d) => d.name === "gvisor")?.missing !== undefined)(
    "two servers with their own homes share the host: a restart of one leaves the other's network whole",
    async () => {
      const homeB = await mkdtemp("/tmp/bothy-net-b-");
      const [tagA, tagB] = [hostTag(lab.home), hostTag(homeB)];
      const envB = { BOTHY_DRIVER: "gvisor", BOTHY_NET_POOL: "10.178.0.0/16" };
      let serverB = topo.serveInHost(homeB, envB);
      try {
        await serverB.url;
        const a = await createSandbox(lab.base, { driver: "gvisor" });
        made.push(a);
        const b = await createSandbox(await serverB.url, { driver: "gvisor" });

        // B dies and starts again: its start-up reconcile takes its own sandbox over and must not
        // take A's objects for orphans, nor rewrite A's rules.
        await serverB.kill();
        // B's chain loses its fixed refusals while B is down, as a chain an older bothy wrote lacks
        // them: the takeover must write the chain again, not trust what it finds.
        const chainB = (): Promise<string> => topo.inHost("nft", ["-a", "list", "chain", "inet", `bothy-${tagB}`, b]);
        const jump = /jump fixed # handle (\d+)/.exec(await chainB());
        expect(jump, "the chain a current server writes jumps to the fixed refusals").not.toBeNull();
        await topo.inHost("nft", ["delete", "rule", "inet", `bothy-${tagB}`, b, "handle", jump![1]!]);
        expect(await chainB()).not.toContain("jump fixed");
        serverB = topo.serveInHost(homeB, envB);
        const baseB = await serverB.url;
        expect(await chainB(), "the taken-over sandbox's chain, written again").toContain("jump fixed");
        for (const [url, id] of [
          [lab.base, a],
          [baseB, b],
        ] as const) {
          const p = await probe(url, id, { public: { get: [PUBLIC_HTTP, 80] }, private: { tcp: [PRIVATE_HOST, 80] } });
          expect(p.results["public"], `${id}: ${JSON.stringify(p.results["public"])}`).toMatchObject({ ok: true });
          refusedFast(p.results["private"], `private from ${id}`);
        }
        expect(serverB.logs.filter((l) => l["event"] === "orphan_removed")).toEqual([]);
        expect(serverB.logs.find((l) => l["event"] === "sandbox_reattached")).toMatchObject({ sandbox_id: b });

        // Each server's objects carry its home's tag, and only its own sandbox's.
        const objectsOf = async (tag: string, id: string) => {
          const all = await topo.bothyObjects(tag);
          return {
            netns: all.netns.filter((n) => n.endsWith(id.slice(4))),
            links: all.links.filter((n) => n.endsWith(id.slice(4, 12))),
            chains: all.chains.filter((c) => c === id),
          };
        };
        const aObjects = {
          netns: [`bothy-${tagA}-${a.slice(4)}`],
          links: [`bv${tagA}-${a.slice(4, 12)}`],
          chains: [a],
        };
        expect(await objectsOf(tagA, a)).toEqual(aObjects);
        expect(await objectsOf(tagB, b)).toEqual({
          netns: [`bothy-${tagB}-${b.slice(4)}`],
          links: [`bv${tagB}-${b.slice(4, 12)}`],
          chains: [b],
        });
        expect(await objectsOf(tagB, a)).toEqual({ netns: [], links: [], chains: [] });

        // B's clean stop stops its sandbox (disk kept) and removes that sandbox's network, and only that.
        await serverB.stop();
        expect(await topo.bothyObjects(tagB)).toEqual({ netns: [], links: [], chains: [], mapElements: 0 });
        const tables = await topo.inHost("nft", ["list", "tables"]);
        expect(tables, "B's table, emptied by its clean stop").not.toContain(`bothy-${tagB}`);
        expect(tables).toContain(`bothy-${tagA}`);
        expect(await objectsOf(tagA, a)).toEqual(aObjects);
        const after = await probe(lab.base, a, { public: { get: [PUBLIC_HTTP, 80] } });
        expect(after.results["public"]).toMatchObject({ ok: true, body: "OK wan\n" });
        expect((await api(lab.base, "DELETE", `/sandboxes/${a}`)).status).toBe(200);
      } finally {
        await serverB.stop();
        await rm(homeB, { recursive: true, force: true });
      }
    },
    600_000,
  );

  it("refuses to start on a pool another home's server uses in the same namespace, naming its table", async () => {
    const homeD = await mkdtemp("/tmp/bothy-net-d-");
    try {
      // The first server runs with the default pool; a second home asks for an overlapping one.
      const failed = await topo.serveFailure(homeD, { BOTHY_DRIVER: "gvisor", BOTHY_NET_POOL: "10.179.128.0/17" });
      expect(failed.code).toBe(1);
      expect(failed.stderr).toContain(
        `overlaps 10.179.0.0/16, the pool of another bothy home on this host (table inet bothy-${hostTag(lab.home)})`,
      );
    } finally {
      await rm(homeD, { recursive: true, force: true });
    }
  });

  it("after an upgrade, removes untagged objects of its own sandboxes at start-up and leaves other homes'", async () => {
    const homeC = await mkdtemp("/tmp/bothy-net-c-");
    const fakeId = () => `sbx_${randomBytes(20).reduce((s, b) => s + "abcdefghijklmnopqrstuvwxyz234567"[b & 31], "")}`;
    // Made the way a bothy without tags made them: X's directory is in this home, Y's is not.
    const legacy = [
      { id: fakeId(), gateway: "10.177.0.5/30", ours: true },
      { id: fakeId(), gateway: "10.176.0.5/30", ours: false },
    ].map((o) => ({ ...o, link: `bv-${o.id.slice(4, 16)}`, netns: `bothy-${o.id.slice(4)}` }));
    let serverC: ServeProcess | undefined;
    try {
      for (const o of legacy) {
        await sh("ip", ["netns", "add", o.netns]);
        await topo.inHost("ip", ["link", "add", o.link, "type", "veth", "peer", "name", "eth0", "netns", o.netns]);
        await topo.inHost("ip", ["link", "set", o.link, "alias", o.id]);
        await topo.inHost("ip", ["addr", "add", o.gateway, "dev", o.link]);
        await sh(
          "nsenter",
          [`--net=${topo.netnsPath}`, "--", "nft", "-f", "-"],
          [
            "add table inet bothy",
            "add map inet bothy egress { type ifname : verdict; }",
            `add chain inet bothy ${o.id}`,
            `add element inet bothy egress { "${o.link}" : goto ${o.id} }`,
          ].join("\n") + "\n",
        );
        if (o.ours) await mkdir(join(homeC, "sandboxes", o.id), { recursive: true });
      }
      // X's gateway lies in C's pool: start-up must take it for its own, not refuse the pool.
      serverC = topo.serveInHost(homeC, { BOTHY_DRIVER: "gvisor", BOTHY_NET_POOL: "10.177.0.0/16" });
      await serverC.url;
      const [x, y] = legacy as [(typeof legacy)[0], (typeof legacy)[0]];
      expect(serverC.logs.filter((l) => l["event"] === "orphan_removed").map((l) => l["sandbox_id"])).toEqual([x.id]);
      const left = await topo.bothyObjects();
      expect(left.links.filter((l) => l === x.link || l === y.link)).toEqual([y.link]);
      expect(left.netns.filter((n) => n === x.netns || n === y.netns)).toEqual([y.netns]);
      expect(left.chains.filter((c) => c === x.id || c === y.id)).toEqual([y.id]);
      expect(existsSync(join(homeC, "sandboxes", x.id))).toBe(false);
    } finally {
      await serverC?.stop();
      for (const o of legacy) {
        await topo.inHost("ip", ["link", "del", o.link]).catch(() => undefined);
        await sh("ip", ["netns", "del", o.netns]).catch(() => undefined);
      }
      await topo.inHost("nft", ["delete", "table", "inet", "bothy"]).catch(() => undefined);
      await rm(homeC, { recursive: true, force: true });
    }
  });

  const gvisor = drivers.find((d) => d.name === "gvisor");
  it.skipIf(gvisor?.missing !== undefined)(
    "a delete removes the rest of a sandbox's network when its interface was removed behind the server's back",
    async () => {
      // The server removes what it made by name; that fails here, and it must find what is left.
      const id = await createSandbox(lab.base, { driver: "gvisor" });
      made.push(id);
      const tag = hostTag(lab.home);
      await topo.inHost("ip", ["link", "del", ifaceName(tag, id, "veth")]);
      expect(await deleteSandbox(lab.base, id)).toBe("deleted");
      const left = await topo.bothyObjects(tag);
      expect([...left.netns, ...left.links, ...left.chains].filter((n) => n.includes(id.slice(4, 12)))).toEqual([]);
    },
  );

  it("leaves no namespace, interface, chain or map element once every sandbox is gone", async () => {
    for (const id of made) await deleteSandbox(lab.base, id);
    expect(await topo.bothyObjects(hostTag(lab.home))).toEqual({ netns: [], links: [], chains: [], mapElements: 0 });
  });
});
