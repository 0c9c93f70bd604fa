import { setTimeout as sleep } from "node:timers/promises";
import { afterEach, describe, expect, it } from "vitest";
import { loadConfig } from "../src/config.ts";
import { FakeWorld } from "./helpers/fake-world.ts";

/**
 * The warm pool is bounded (issue 26, item 2): pools only for the configured shapes
 * (BOTHY_POOL_SHAPES), pool sandboxes count toward BOTHY_MAX_SANDBOXES, and a rebuilt template's
 * older pools are drained. Fake drivers, a real ledger.
 */
let world: FakeWorld | undefined;
afterEach(async () => {
  await world?.manager.close();
  world?.ledger.close();
  world = undefined;
});

/** Polls until `ok` holds (a pool boots in the background); fails after a deadline. */
async function until(ok: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(2);
  }
}

/** Ids on the fake host that no ledger row names: the pool's. */
async function pooled(w: FakeWorld): Promise<string[]> {
  const ids = w.host.ids();
  const rows = await Promise.all(ids.map((id) => w.ledger.getSandbox(id)));
  return ids.filter((_, i) => rows[i] === undefined);
}

function createdWarm(w: FakeWorld, id: string): boolean | undefined {
  const ev = w.events.find((e) => e.event === "sandbox_created" && e.fields["sandbox_id"] === id);
  return ev?.fields["warm"] as boolean | undefined;
}

describe("the warm pool's shapes", () => {
  it("a create of a shape that is not configured starts no pool for it", async () => {
    const w = (world = new FakeWorld({ BOTHY_POOL_SIZE: "2" }));
    await w.boot();
    await w.create({ memory_mib: 256 });
    await w.create({ vcpu: 2, memory_mib: 640 });
    // A refill starts its boot in the same turn as the claim that asked for it: none was asked.
    expect(w.manager.poolStats()).toEqual({ ready: 0, booting: 0 });
    expect(await pooled(w)).toEqual([]);
  });

  it("the default shape is a create's defaults; a create of it starts that pool, and the next is warm", async () => {
    const w = (world = new FakeWorld({ BOTHY_POOL_SIZE: "1" }));
    await w.boot();
    const cold = await w.create({ vcpu: undefined, memory_mib: undefined });
    expect(createdWarm(w, cold)).toBe(false);
    await until(() => w.manager.poolStats().ready === 1, "the pool to fill");
    const warm = await w.create({ vcpu: undefined, memory_mib: undefined });
    expect(createdWarm(w, warm)).toBe(true);
  });

  it("BOTHY_POOL_SHAPES sets the shapes: warm() fills each, and creates of them are warm", async () => {
    const w = (world = new FakeWorld({ BOTHY_POOL_SIZE: "1", BOTHY_POOL_SHAPES: "seed:2:1024,seed:1:256:qemu" }));
    await w.boot();
    await w.manager.warm();
    await until(() => w.manager.poolStats().ready === 2, "both pools to fill");
    const big = await w.create({ vcpu: 2, memory_mib: 1024 });
    const vm = await w.create({ vcpu: 1, memory_mib: 256, driver: "qemu" });
    expect([createdWarm(w, big), createdWarm(w, vm)]).toEqual([true, true]);
    expect((await w.ledger.getSandbox(vm))?.driver).toBe("qemu");
    const other = await w.create({ vcpu: 1, memory_mib: 256, driver: "gvisor" });
    expect(createdWarm(w, other)).toBe(false);
  });

  it("refuses a malformed BOTHY_POOL_SHAPES at start-up, saying the format", () => {
    for (const bad of ["seed", "seed:0:512", "seed:1:64", "seed:1:512:firecracker", "Seed:1:512", "a:1:512,".repeat(9)])
      expect(() => loadConfig({ BOTHY_POOL_SHAPES: bad, BOTHY_MAX_VCPU: "4", BOTHY_MAX_MEMORY_MIB: "4096" })).toThrow(
        /BOTHY_POOL_SHAPES: .*(TEMPLATE:VCPU:MEMORY_MIB|vcpu must|memory must|driver is one of|at most 8)/,
      );
    expect(loadConfig({ BOTHY_POOL_SHAPES: "seed:1:512, code-interpreter:2:1024:qemu" }).poolShapes).toEqual([
      { template: "seed", vcpu: 1, memoryMib: 512, driver: undefined },
      { template: "code-interpreter", vcpu: 2, memoryMib: 1024, driver: "qemu" },
    ]);
  });
});

describe("the warm pool within BOTHY_MAX_SANDBOXES", () => {
  it("pool sandboxes count toward the limit: the host never holds more, and a create takes a pool sandbox's room", async () => {
    const w = (world = new FakeWorld({
      BOTHY_POOL_SIZE: "1",
      BOTHY_MAX_SANDBOXES: "2",
      BOTHY_POOL_SHAPES: "seed:1:256",
    }));
    await w.boot();
    await w.manager.warm();
    await until(() => w.manager.poolStats().ready === 1, "the pool to fill");
    const a = await w.create({ memory_mib: 512 }); // one live, one pooled: full
    expect(w.host.ids()).toHaveLength(2);
    const b = await w.create({ memory_mib: 512 }); // the pool gives up its sandbox for it
    expect((await w.ledger.getSandbox(b))?.state).toBe("running");
    await until(() => w.host.ids().length === 2, "the evicted pool sandbox to go");
    expect(w.events.some((e) => e.event === "pool_evicted")).toBe(true);
    // Full with live sandboxes: no refill boots, and the next create is refused.
    await w.manager.warm(); // a refill would be booting by the time warm() returns
    expect(w.manager.poolStats()).toEqual({ ready: 0, booting: 0 });
    await expect(w.create({ memory_mib: 512 })).rejects.toMatchObject({ code: "capacity_exhausted" });
    expect(w.host.ids().sort()).toEqual([a, b].sort());
  });

  it("a claim from the pool fits on a full host (it takes no more of it)", async () => {
    const w = (world = new FakeWorld({
      BOTHY_POOL_SIZE: "1",
      BOTHY_MAX_SANDBOXES: "2",
      BOTHY_POOL_SHAPES: "seed:1:256",
    }));
    await w.boot();
    await w.manager.warm();
    await until(() => w.manager.poolStats().ready === 1, "the pool to fill");
    await w.create({ memory_mib: 512 });
    const claimed = await w.create({ memory_mib: 256 });
    expect(createdWarm(w, claimed)).toBe(true);
    expect(w.host.ids()).toHaveLength(2);
  });
});

describe("the warm pool across template builds", () => {
  it("drains the pool of a template's older build once a create or warm sees the new one", async () => {
    const w = (world = new FakeWorld({ BOTHY_POOL_SIZE: "1", BOTHY_POOL_SHAPES: "seed:1:256" }));
    await w.boot();
    await w.manager.warm();
    await until(() => w.manager.poolStats().ready === 1, "the pool to fill");
    const [old] = await pooled(w);
    w.template = { ...w.template, hash: "h2", rootfs: "/nonexistent/rootfs-h2" }; // `bothy template build --force`
    const fresh = await w.create({ memory_mib: 256 });
    expect(createdWarm(w, fresh)).toBe(false); // the old build's sandbox is not handed out
    await until(() => !w.host.ids().includes(old ?? ""), "the old build's pool sandbox to go");
    await until(() => w.manager.poolStats().ready === 1, "the new build's pool to fill");
    expect(await pooled(w)).not.toContain(old);
    expect(w.events.filter((e) => e.event === "pool_evicted").map((e) => e.fields["sandbox_id"])).toEqual([old]);
  });
});
