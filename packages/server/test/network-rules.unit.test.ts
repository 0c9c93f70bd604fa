import { mkdtemp, rm, symlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { egressFromRequest } from "../src/network/egress-policy.ts";
import { normalizeCidr, parseCidr, subnetAt } from "../src/network/ipv4.ts";
import { mergeCidrs, renderBase, renderSandboxAdd, renderSandboxRemove } from "../src/network/nft-ruleset.ts";
import { cgroupPath, hostTag, ifaceName, netnsName, nftTable, snapshotTapName } from "../src/util/host-names.ts";

describe("network rules", () => {
  it("normalizes CIDRs and carves /30s from the pool", () => {
    expect(normalizeCidr("10.1.2.3/8")).toBe("10.0.0.0/8");
    expect(normalizeCidr("203.0.113.7")).toBe("203.0.113.7/32");
    expect(() => parseCidr("2001:db8::/32")).toThrow(/IPv6 is always blocked/);
    expect(subnetAt(parseCidr("10.179.0.0/16"), 1)).toEqual({
      index: 1,
      gateway: "10.179.0.5",
      guest: "10.179.0.6",
      prefix: 30,
    });
    expect(egressFromRequest({ allow_out: ["10.200.0.10", "10.200.0.10/32"] })).toEqual({
      internet: true,
      allowOut: ["10.200.0.10/32"],
      denyOut: [],
    });
  });

  it("drops nested blocks so nft gets no overlapping interval", () => {
    expect(mergeCidrs(["10.0.0.0/8", "10.179.0.0/16", "192.168.0.0/16"])).toEqual(["10.0.0.0/8", "192.168.0.0/16"]);
  });

  it("renders the base table: sandbox interfaces refused by the host, TCP reset, masquerade on the uplink", () => {
    const text = renderBase({ tag: "k3x9", pool: "10.179.0.0/16", uplink: "eth0", extraBlocked: ["168.63.129.16/32"] });
    expect(text).toContain('add rule inet bothy-k3x9 input iifname "bvk3x9*" goto refuse');
    expect(text).toContain('add rule inet bothy-k3x9 forward iifname "btk3x9*" drop');
    expect(text).toContain("add rule inet bothy-k3x9 refuse meta l4proto tcp reject with tcp reset");
    expect(text).toContain("168.63.129.16/32");
    expect(text).toContain('add rule inet bothy-k3x9 postrouting ip saddr 10.179.0.0/16 oifname "eth0" masquerade');
    // Nothing in it matches another home's interfaces.
    expect(text).not.toMatch(/"b[vt]-?\*"/);
  });

  it("lets replies to the host's own connections to a sandbox in, from that interface's address only, before the refusal", () => {
    const lines = renderBase({ tag: "k3x9", pool: "10.179.0.0/16", uplink: "eth0", extraBlocked: [] })
      .trim()
      .split("\n");
    const at = (s: string) => lines.findIndex((l) => l.includes(s));
    for (const w of ['"bvk3x9*"', '"btk3x9*"']) {
      const reply = at(`input iifname ${w} ct state established,related fib saddr . iif oif exists accept`);
      expect(reply, w).toBeGreaterThan(-1);
      expect(reply).toBeLessThan(at(`input iifname ${w} goto refuse`));
    }
    // A sandbox's new connection is never accepted by input (only the gateway's redirected ones are).
    expect(
      lines.filter((l) => / input .*accept$/.test(l) && !/ct state established,related|ct status dnat/.test(l)),
    ).toEqual([]);
    // Connections into a sandbox from anywhere but the host itself stay dropped in forward.
    expect(at('forward oifname "bvk3x9*" drop')).toBeGreaterThan(at('forward oifname "bvk3x9*" ct state established'));
  });

  it("puts allow_out before deny_out and the private blocks, and refuses the rest without internet", () => {
    const text = renderSandboxAdd({
      table: "inet bothy-k3x9",
      sandboxId: "sbx_aaaaaaaaaaaaaaaaaaaa",
      iface: "bvk3x9-aaaaaaaa",
      guest: "10.179.0.6",
      policy: { internet: false, allowOut: ["10.200.0.10/32"], denyOut: ["203.0.113.0/24"] },
    });
    const lines = text.trim().split("\n");
    const at = (s: string) => lines.findIndex((l) => l.includes(s));
    expect(at("10.200.0.10/32 } accept")).toBeLessThan(at("203.0.113.0/24 } goto refuse"));
    expect(at("203.0.113.0/24")).toBeLessThan(at("jump blocked"));
    expect(lines.at(-2)).toBe("add rule inet bothy-k3x9 sbx_aaaaaaaaaaaaaaaaaaaa goto refuse");
    expect(text).toContain("ip saddr != 10.179.0.6 drop");
    expect(renderSandboxRemove("inet bothy-k3x9", "sbx_aaaaaaaaaaaaaaaaaaaa", ["bvk3x9-aaaaaaaa"], true)).toBe(
      'delete element inet bothy-k3x9 egress { "bvk3x9-aaaaaaaa" }\ndelete chain inet bothy-k3x9 sbx_aaaaaaaaaaaaaaaaaaaa\n',
    );
  });

  it("refuses the pool, loopback and 0/8 before any allow_out accept, whatever the policy names", () => {
    const base = renderBase({ tag: "k3x9", pool: "10.179.0.0/16", uplink: "eth0", extraBlocked: [] });
    expect(base).toContain(
      "add rule inet bothy-k3x9 fixed ip daddr { 0.0.0.0/8, 127.0.0.0/8, 10.179.0.0/16 } goto refuse",
    );
    // A policy naming another sandbox's address, the whole pool and loopback, as one stored before
    // create checked allow_out might.
    const text = renderSandboxAdd({
      table: "inet bothy-k3x9",
      sandboxId: "sbx_aaaaaaaaaaaaaaaaaaaa",
      iface: "bvk3x9-aaaaaaaa",
      guest: "10.179.0.6",
      policy: { internet: true, allowOut: ["10.179.0.10/32", "10.179.0.0/16", "127.0.0.1/32"], denyOut: [] },
    });
    const lines = text.trim().split("\n");
    const at = (s: string) => lines.findIndex((l) => l.includes(s));
    const fixed = at("jump fixed");
    expect(fixed).toBeGreaterThan(at("ct state established,related accept"));
    // Every accept but the replies' comes after it: the allow_out accept and internet's.
    const accepts = [...lines.entries()].filter(([, l]) => / accept$/.test(l) && !l.includes("ct state"));
    expect(accepts.length).toBe(2);
    for (const [i] of accepts) expect(i).toBeGreaterThan(fixed);
  });

  it("redirects a gateway sandbox's TCP 80/443 to the proxy and lets only those redirected connections in", () => {
    const text = renderBase({
      tag: "k3x9",
      pool: "10.179.0.0/16",
      uplink: "eth0",
      extraBlocked: [],
      gatewayPorts: { http: 40080, https: 40443 },
    });
    const lines = text.trim().split("\n");
    const at = (s: string) => lines.findIndex((l) => l.includes(s));
    expect(text).toContain("add set inet bothy-k3x9 gateway { type ifname . ipv4_addr; }");
    expect(text).toContain(
      "add rule inet bothy-k3x9 prerouting iifname . ip saddr @gateway tcp dport 443 redirect to :40443",
    );
    // Accepted before the refusal of everything from sandbox interfaces; any other source refused.
    expect(at("ct status dnat tcp dport { 40080, 40443 } accept")).toBeLessThan(
      at('input iifname "bvk3x9*" goto refuse'),
    );
    expect(at("input tcp dport { 40080, 40443 } goto refuse")).toBeLessThan(at('input iifname "bvk3x9*" goto refuse'));
    // Not redirected (no gateway listening): never forwarded unjudged.
    expect(at("forward iifname . ip saddr @gateway tcp dport { 80, 443 } goto refuse")).toBeLessThan(
      at("forward iifname vmap @egress"),
    );
    expect(renderBase({ tag: "k3x9", pool: "10.179.0.0/16", uplink: "eth0", extraBlocked: [] })).not.toContain(
      "redirect",
    );
    // With the policy resolver: the set's UDP 53, to any address, goes to it; nothing else reaches its port.
    const withDns = renderBase({
      tag: "k3x9",
      pool: "10.179.0.0/16",
      uplink: "eth0",
      extraBlocked: [],
      gatewayPorts: { http: 40080, https: 40443, dns: 40053 },
    })
      .trim()
      .split("\n");
    const dnsAt = (s: string) => withDns.findIndex((l) => l.includes(s));
    expect(withDns).toContain(
      "add rule inet bothy-k3x9 prerouting iifname . ip saddr @gateway udp dport 53 redirect to :40053",
    );
    expect(dnsAt("iifname . ip saddr @gateway ct status dnat udp dport 40053 accept")).toBeLessThan(
      dnsAt("input udp dport 40053 goto refuse"),
    );
    expect(dnsAt("input udp dport 40053 goto refuse")).toBeLessThan(dnsAt('input iifname "bvk3x9*" goto refuse'));
    expect(text).not.toContain("udp dport 53");

    const add = renderSandboxAdd({
      table: "inet bothy-k3x9",
      sandboxId: "sbx_aaaaaaaaaaaaaaaaaaaa",
      iface: "bvk3x9-aaaaaaaa",
      guest: "10.179.0.6",
      policy: { internet: true, allowOut: [], denyOut: [], gateway: true },
    });
    expect(add).toContain('add element inet bothy-k3x9 gateway { "bvk3x9-aaaaaaaa" . 10.179.0.6 }');
    expect(
      renderSandboxRemove("inet bothy-k3x9", "sbx_aaaaaaaaaaaaaaaaaaaa", [], false, [
        { iface: "bvk3x9-aaaaaaaa", guest: "10.179.0.6" },
      ]),
    ).toBe('delete element inet bothy-k3x9 gateway { "bvk3x9-aaaaaaaa" . 10.179.0.6 }\n');
  });

  it("names every host object with the home's tag, within the kernel's limits", async () => {
    expect(hostTag("/")).toMatch(/^[a-z2-7]{4}$/);
    expect(hostTag("/")).not.toBe(hostTag("/tmp"));
    // The tag comes from the real path: a home reached through a link gets that home's tag.
    const dir = await mkdtemp(join(tmpdir(), "bothy-tag-"));
    try {
      await symlink(dir, `${dir}.link`);
      expect(hostTag(`${dir}.link`)).toBe(hostTag(dir));
    } finally {
      await rm(`${dir}.link`, { force: true });
      await rm(dir, { recursive: true, force: true });
    }
    const id = "sbx_abcdefghijklmnopqrst";
    expect(ifaceName("k3x9", id, "veth")).toBe("bvk3x9-abcdefgh");
    expect(ifaceName("k3x9", id, "tap")).toBe("btk3x9-abcdefgh");
    expect(snapshotTapName("k3x9", "0123456789abcdef")).toBe("bsk3x9-01234567");
    for (const name of [ifaceName("k3x9", id, "veth"), snapshotTapName("k3x9", "0123456789abcdef")])
      expect(name.length).toBeLessThanOrEqual(15);
    expect(netnsName("k3x9", id)).toBe("bothy-k3x9-abcdefghijklmnopqrst");
    expect(nftTable("k3x9")).toBe("inet bothy-k3x9");
    expect(cgroupPath("k3x9", id)).toBe("/bothy-k3x9/sbx_abcdefghijklmnopqrst");
  });
});
