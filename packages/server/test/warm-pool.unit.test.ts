import { setTimeout as sleep } from "node:timers/promises";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { BootedSandbox } from "../src/sandboxes/boot.ts";
import { WarmPool, type PoolShape } from "../src/sandboxes/warm-pool.ts";
import { FakeDriver, FakeHost } from "./helpers/fake-driver.ts";

/** The seed template's default shape on a fake gVisor driver over `host`. */
function seedShape(host: FakeHost): PoolShape {
  return {
    driver: new FakeDriver("gvisor", host),
    templateName: "seed",
    templateRoot: "/fake/seed",
    templateHash: "seed",
    templateEnv: {},
    vcpu: 1,
    memoryMib: 512,
    diskMib: 1024,
    maxProcesses: 64,
  };
}

describe("the warm pool's refill after a claim", () => {
  let host: FakeHost;
  let shape: PoolShape;
  let pool: WarmPool;
  beforeEach(() => {
    host = new FakeHost();
    shape = seedShape(host);
    pool = new WarmPool({
      size: 1,
      shapes: [{ driver: "gvisor", template: "seed", vcpu: 1, memoryMib: 512, diskMib: 1024, maxProcesses: 64 }],
      dirFor: (id) => `/fake/${id}`,
      bootTimeoutMs: 10_000,
      log: () => undefined,
      hasRoom: () => true,
    });
  });
  afterEach(async () => {
    await pool.close();
  });

  /** Claims until the pool hands a booted sandbox over (each empty claim only finds the refill running). */
  async function claimBooted(): Promise<BootedSandbox> {
    for (;;) {
      const got = pool.claim(shape);
      if (got) return got;
      await sleep(1);
    }
  }

  it("a claim that finds none starts the refill at once", () => {
    expect(pool.claim(shape)).toBeUndefined();
    expect(pool.ownedIds().size).toBe(1); // booting
  });

  it("after a claim, boots again only once the claimed sandbox's first command has ended", async () => {
    const claimed = await claimBooted();
    expect(pool.ownedIds().size).toBe(0); // no boot competes with the claimed sandbox's first command
    pool.settled(claimed.spec.id);
    expect(pool.ownedIds().size).toBe(1);
    pool.settled(claimed.spec.id); // a second end changes nothing
    expect(pool.ownedIds().size).toBe(1);
  });

  it("after a claim whose sandbox runs nothing, boots again within a second", async () => {
    await claimBooted();
    expect(pool.ownedIds().size).toBe(0);
    while (pool.ownedIds().size === 0) await sleep(20);
    expect(pool.ownedIds().size).toBe(1);
  });
});

describe("a snapshot's pool (a snapshot taken with warm)", () => {
  let pool: WarmPool;
  let shape: PoolShape;
  beforeEach(() => {
    shape = seedShape(new FakeHost());
    // No template pools at all: a snapshot's pool needs none.
    pool = new WarmPool({
      size: 0,
      shapes: [],
      dirFor: (id) => `/fake/${id}`,
      bootTimeoutMs: 10_000,
      log: () => undefined,
      hasRoom: () => true,
    });
  });
  afterEach(async () => {
    await pool.close();
  });

  it("boots the count asked, hands them only to claims of that snapshot, never refills, and drops the rest with it", async () => {
    const ofA = { ...shape, templateRoot: "/fake/snap-a", snapshotId: "snap_a" };
    pool.warmSnapshot(ofA, 2);
    const deadline = Date.now() + 10_000;
    while (pool.snapshotReady("snap_a") < 2) {
      if (Date.now() > deadline) throw new Error("the snapshot's pool did not fill");
      await sleep(5); // the poll's pace
    }
    // The template's shape and another snapshot's find nothing.
    expect(pool.claim(shape)).toBeUndefined();
    expect(pool.claim({ ...ofA, snapshotId: "snap_b" })).toBeUndefined();
    const got = pool.claim(ofA);
    expect(got?.spec.templateRoot).toBe("/fake/snap-a");
    expect(pool.stats()).toEqual({ ready: 1, booting: 0 });
    await pool.dropSnapshot("snap_a");
    expect(pool.stats()).toEqual({ ready: 0, booting: 0 });
    expect(pool.ownedIds().size).toBe(0);
    expect(pool.claim(ofA)).toBeUndefined();
  });
});
