import { afterEach, describe, expect, it } from "vitest";
import { FakeWorld } from "./helpers/fake-world.ts";

/**
 * What a lifecycle review found (issue 26, item 2), each with fake drivers and a real ledger:
 * asleep sandboxes expire like running ones; a failed resume is recorded before its teardown.
 */
let world: FakeWorld | undefined;
afterEach(async () => {
  await world?.manager.close();
  await world?.ledger.close();
  world = undefined;
});

const past = (): string => new Date(Date.now() - 1000).toISOString();

describe("expiry of sleeping sandboxes", () => {
  it("a sandbox that went to sleep with its disk kept (stopped) is deleted, disk and all, once it expires", async () => {
    const w = (world = new FakeWorld());
    await w.boot();
    const id = await w.create({ driver: "gvisor" });
    await w.manager.sleep(id);
    expect(await w.state(id)).toBe("stopped");
    expect(w.host.machines.get(id)?.disk).toBe(true);
    await w.ledger.setExpiresAt(id, past());
    const deleted = w.next("sandbox_deleted", id);
    await w.sweep();
    expect(await w.state(id)).not.toBe("stopped");
    await deleted;
    expect(await w.state(id)).toBe("deleted");
    expect(w.host.ids()).toEqual([]);
  });

  it("a paused sandbox is deleted with its saved memory once it expires; one not yet expired stays", async () => {
    const w = (world = new FakeWorld());
    await w.boot();
    const expired = await w.create({ driver: "qemu" });
    const kept = await w.create({ driver: "gvisor" });
    await w.manager.pause(expired);
    await w.manager.sleep(kept);
    await w.ledger.setExpiresAt(expired, past());
    const deleted = w.next("sandbox_deleted", expired);
    await w.sweep();
    await deleted;
    expect(await w.state(expired)).toBe("deleted");
    expect(await w.state(kept)).toBe("stopped");
    expect(w.host.ids()).toEqual([kept]);
  });

  it("after a restart, a stopped sandbox still expires", async () => {
    const w = (world = new FakeWorld());
    await w.boot();
    const id = await w.create({ driver: "gvisor" });
    await w.manager.close(); // a clean stop leaves it stopped with its disk
    await w.boot();
    expect(await w.state(id)).toBe("stopped");
    await w.ledger.setExpiresAt(id, past());
    const deleted = w.next("sandbox_deleted", id);
    await w.sweep();
    expect(await w.state(id)).not.toBe("stopped");
    await deleted;
    expect(await w.state(id)).toBe("deleted");
    expect(w.host.ids()).toEqual([]);
  });
});

describe("a resume that fails", () => {
  it("records the sandbox failed before its teardown: a teardown that fails leaves no paused row with nothing behind it", async () => {
    const w = (world = new FakeWorld());
    await w.boot();
    const id = await w.create({ driver: "qemu" });
    await w.manager.pause(id);
    w.host.failStarts = 1; // the restore fails
    w.host.failRemovals = 1; // and so does the teardown after it
    await expect(w.manager.resume(id)).rejects.toMatchObject({ code: "agent_unavailable" });
    expect(await w.state(id)).toBe("failed");
    expect((await w.ledger.getSandbox(id))?.error).toMatch(/restore/);
    // What the teardown left is nobody's now: the sweeper removes it (two passes, as for any orphan).
    expect(w.manager.ownedIds().has(id)).toBe(false);
    await w.sweep();
    await w.sweep();
    expect(w.host.ids()).toEqual([]);
  });

  it("that tears down cleanly ends failed with nothing left on the host", async () => {
    const w = (world = new FakeWorld());
    await w.boot();
    const id = await w.create({ driver: "qemu" });
    await w.manager.pause(id);
    w.host.failStarts = 1;
    await expect(w.manager.resume(id)).rejects.toMatchObject({ code: "agent_unavailable" });
    expect(await w.state(id)).toBe("failed");
    expect(w.host.ids()).toEqual([]);
  });
});
