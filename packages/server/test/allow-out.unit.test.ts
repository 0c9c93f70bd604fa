import { describe, expect, it } from "vitest";
import { checkAllowOut, permitProblem } from "../src/network/allow-out.ts";

/**
 * What a create's `allow_out` may open, judged from the side of a tenant key trying to open more
 * than it should: another sandbox (the pool), the host's loopback, cloud metadata, a private LAN.
 */
const pool = "10.179.0.0/16";
const none = { pool, extraBlocked: [], permit: [] };
const permitted = { pool, extraBlocked: ["168.63.129.16/32"], permit: ["10.200.0.0/24", "168.63.129.16/32"] };

function refusal(allowOut: string[], ceiling: Parameters<typeof checkAllowOut>[1], mayOpenPrivate: boolean) {
  try {
    checkAllowOut(allowOut, ceiling, mayOpenPrivate);
  } catch (err) {
    return err as { code: string; status: number; message: string; details?: Record<string, unknown> };
  }
  return undefined;
}

describe("allow_out ceiling", () => {
  it("never opens another sandbox, the pool, loopback or 0/8, even to a key with network:private", () => {
    for (const entry of ["10.179.0.6/32", "10.179.0.0/16", "10.0.0.0/8", "0.0.0.0/0", "127.0.0.1/32", "0.0.0.0/8"]) {
      const r = refusal([entry], { ...permitted, permit: ["10.0.0.0/8", "0.0.0.0/0"] }, true);
      expect(r, entry).toMatchObject({ code: "allow_out_not_permitted" });
      expect(r?.message, entry).toMatch(/host and other sandboxes.*Remove the entry/);
    }
  });

  it("refuses a private, metadata or BOTHY_NET_BLOCK entry to a key without network:private", () => {
    for (const entry of ["169.254.169.254/32", "10.200.0.10/32", "192.168.1.0/24", "168.63.129.16/32", "172.0.0.0/8"]) {
      const r = refusal([entry], permitted, false);
      expect(r, entry).toMatchObject({ code: "scope_missing", details: { scope: "network:private" } });
      expect(r?.message, entry).toMatch(/needs a key with the network:private scope, which an admin grants/);
    }
  });

  it("opens private addresses only inside BOTHY_ALLOW_OUT_PERMIT, empty by default", () => {
    expect(refusal(["169.254.169.254/32"], none, true)).toMatchObject({
      code: "allow_out_not_permitted",
      message: expect.stringMatching(/outside BOTHY_ALLOW_OUT_PERMIT \(empty: none at all\)/),
    });
    expect(refusal(["169.254.169.254/32"], permitted, true)).toMatchObject({ code: "allow_out_not_permitted" });
    // Wider than the permitted block, or straddling it: refused.
    expect(refusal(["10.200.0.0/16"], permitted, true)).toMatchObject({ code: "allow_out_not_permitted" });
    expect(refusal(["172.0.0.0/8"], permitted, true)).toMatchObject({ code: "allow_out_not_permitted" });
    expect(refusal(["10.200.0.10/32", "10.200.0.128/25", "168.63.129.16/32"], permitted, true)).toBeUndefined();
  });

  it("leaves public addresses to any key", () => {
    expect(refusal(["203.0.113.7/32", "198.51.100.0/24"], none, false)).toBeUndefined();
  });

  it("refuses a permit that names the pool or loopback, or is not a block", () => {
    expect(permitProblem(["10.200.0.0/24", "169.254.169.254"], pool)).toBeUndefined();
    expect(permitProblem(["10.0.0.0/8"], pool)).toMatch(/10\.0\.0\.0\/8 overlaps 10\.179\.0\.0\/16/);
    expect(permitProblem(["127.0.0.53/32"], pool)).toMatch(/overlaps 127\.0\.0\.0\/8/);
    expect(permitProblem(["example.com"], pool)).toMatch(/not an IPv4 address/);
  });
});
