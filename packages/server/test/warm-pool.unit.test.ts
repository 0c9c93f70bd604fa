import { setTimeout as sleep } from "node:timers/promises";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { BootedSandbox } from "../src/sandboxes/boot.ts";
import { WarmPool, type PoolShape } from "../src/sandboxes/warm-pool.ts";
import { FakeDriver, FakeHost } from "./helpers/fake-driver.ts";

describe("the warm pool's refill after a claim", () => {
  let host: FakeHost;
  let shape: PoolShape;
  let pool: WarmPool;
  beforeEach(() => {
    host = new FakeHost();
    shape = {
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
