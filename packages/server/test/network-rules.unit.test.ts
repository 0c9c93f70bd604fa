import { describe, expect, it } from "vitest";
import { egressFromRequest } from "../src/network/host-network.ts";
import { normalizeCidr, parseCidr, subnetAt } from "../src/network/ipv4.ts";
import { mergeCidrs, renderBase, renderSandboxAdd, renderSandboxRemove } from "../src/network/nft-ruleset.ts";

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
    const text = renderBase({ pool: "10.179.0.0/16", uplink: "eth0", extraBlocked: ["168.63.129.16/32"] });
    expect(text).toContain('add rule inet bothy input iifname "bv-*" goto refuse');
    expect(text).toContain("add rule inet bothy refuse meta l4proto tcp reject with tcp reset");
    expect(text).toContain("168.63.129.16/32");
    expect(text).toContain('add rule inet bothy postrouting ip saddr 10.179.0.0/16 oifname "eth0" masquerade');
  });

  it("puts allow_out before deny_out and the private blocks, and refuses the rest without internet", () => {
    const text = renderSandboxAdd({
      sandboxId: "sbx_aaaaaaaaaaaaaaaaaaaa",
      iface: "bv-aaaaaaaaaaaa",
      guest: "10.179.0.6",
      policy: { internet: false, allowOut: ["10.200.0.10/32"], denyOut: ["203.0.113.0/24"] },
    });
    const lines = text.trim().split("\n");
    const at = (s: string) => lines.findIndex((l) => l.includes(s));
    expect(at("10.200.0.10/32 } accept")).toBeLessThan(at("203.0.113.0/24 } goto refuse"));
    expect(at("203.0.113.0/24")).toBeLessThan(at("jump blocked"));
    expect(lines.at(-2)).toBe("add rule inet bothy sbx_aaaaaaaaaaaaaaaaaaaa goto refuse");
    expect(text).toContain("ip saddr != 10.179.0.6 drop");
    expect(renderSandboxRemove("sbx_aaaaaaaaaaaaaaaaaaaa", ["bv-aaaaaaaaaaaa"], true)).toBe(
      'delete element inet bothy egress { "bv-aaaaaaaaaaaa" }\ndelete chain inet bothy sbx_aaaaaaaaaaaaaaaaaaaa\n',
    );
  });
});
