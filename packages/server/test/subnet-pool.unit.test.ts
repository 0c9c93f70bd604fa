import { describe, expect, it } from "vitest";
import { SubnetPool } from "../src/network/subnet-pool.ts";

/** The subnet pool alone: no host command, so every case runs in microseconds. */
describe("subnet pool", () => {
  it("gives each sandbox its own /30, the lowest free one, never index 0", () => {
    const pool = new SubnetPool("10.77.0.0/28");
    expect(pool.capacity).toBe(4);
    expect(pool.allocate("a")).toEqual({ index: 1, gateway: "10.77.0.5", guest: "10.77.0.6", prefix: 30 });
    expect(pool.allocate("b").index).toBe(2);
    // A second allocate of the same sandbox keeps its subnet.
    expect(pool.allocate("a").index).toBe(1);
    pool.free("a");
    expect(pool.of("a")).toBeUndefined();
    expect(pool.allocate("c").index).toBe(1);
  });

  it("refuses past its capacity with capacity_exhausted, saying what to do", () => {
    const pool = new SubnetPool("10.77.0.0/29");
    pool.allocate("a");
    expect(() => pool.allocate("b")).toThrow(
      expect.objectContaining({ code: "capacity_exhausted", message: expect.stringMatching(/BOTHY_NET_POOL/) }),
    );
    pool.free("a");
    expect(pool.allocate("b").index).toBe(1);
  });

  it("finds a sandbox by its guest address only, IPv4-mapped too", () => {
    const pool = new SubnetPool("10.77.0.0/24");
    pool.allocate("a");
    pool.allocate("b");
    expect(pool.byGuest("10.77.0.10")).toBe("b");
    expect(pool.byGuest("::ffff:10.77.0.6")).toBe("a");
    // The host's end, another subnet's addresses, a free subnet, garbage: nobody.
    for (const addr of ["10.77.0.5", "10.77.0.7", "10.77.0.14", "10.77.0.2", "not-an-ip", ""])
      expect(pool.byGuest(addr)).toBeUndefined();
  });

  it("lets a sandbox that outlived a restart claim its subnet by its gateway, but not another's", () => {
    const pool = new SubnetPool("10.77.0.0/24");
    pool.allocate("a"); // index 1, gateway 10.77.0.5
    expect(pool.claimable("b", "10.77.0.5")).toBe(false);
    expect(pool.claimable("a", "10.77.0.5")).toBe(true);
    // Not a gateway (a guest address), index 0, outside the pool.
    for (const gw of ["10.77.0.6", "10.77.0.1", "10.78.0.5"]) expect(pool.claimable("b", gw)).toBe(false);
    expect(pool.claim("b", "10.77.0.9")).toMatchObject({ index: 2, guest: "10.77.0.10" });
    expect(pool.of("b")?.index).toBe(2);
    // A claimed subnet is skipped by allocate.
    expect(pool.allocate("c").index).toBe(3);
  });

  it("refuses a pool smaller than one /30", () => {
    expect(() => new SubnetPool("10.77.0.0/31")).toThrow(/smaller than one \/30/);
  });
});
