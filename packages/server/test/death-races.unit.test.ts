import { BothyError } from "@bothy/protocol";
import { afterAll, describe, expect, it } from "vitest";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { TransitionError } from "../src/sandboxes/lifecycle.ts";
import { FakeWorld } from "./helpers/fake-world.ts";

/**
 * A sandbox dying on its own while a sleep or a delete runs on it, with a ledger whose every call
 * is a round trip (as PostgreSQL's are): a death is noticed twice (its agent's channel, then its
 * process), and between a read and the write it decides, another turn of the event loop comes in
 * which the other party moves on. The in-memory SQLite store, wrapped so that each call takes
 * `TRIP` turns each way, makes those turns come at the same places on every run; the kill lands
 * at each turn from `SPREAD` turns before the operation is asked to `SPREAD` turns into it.
 */
const TRIP = 2;
const SPREAD = 16;
const OFFSETS = Array.from({ length: 2 * SPREAD + 1 }, (_, i) => i - SPREAD);

/** Runs `op` and kills `id` `offset` turns after it was asked (before, when negative); answers how `op` ended. */
async function killAt(w: FakeWorld, id: string, offset: number, op: () => Promise<unknown>): Promise<unknown> {
  if (offset < 0) {
    w.host.kill(id);
    await turns(-offset);
  }
  const running = op().then(
    () => undefined,
    (err: unknown) => err ?? new Error("rejected with nothing"),
  );
  if (offset >= 0) {
    await turns(offset);
    w.host.kill(id);
  }
  return running;
}

let inFlight = 0;

/**
 * `store` with every asynchronous call taking `TRIP` turns before and after, and counted while
 * outstanding; a state move is a transaction of several statements on PostgreSQL, so its write
 * lands `WRITE` trips in.
 */
const WRITE = 3;
function roundTrips<T extends object>(store: T): T {
  const wrap = (value: unknown, self: unknown, key: PropertyKey): unknown => {
    if (typeof value === "function")
      return async (...args: unknown[]) => {
        inFlight++;
        try {
          await turns(key === "transition" ? WRITE * TRIP : TRIP);
          const result: unknown = await (value as (...a: unknown[]) => unknown).apply(self, args);
          await turns(TRIP);
          return result;
        } finally {
          inFlight--;
        }
      };
    if (typeof value === "object" && value !== null) return roundTrips(value);
    return value;
  };
  return new Proxy(store, { get: (target, key) => wrap(Reflect.get(target, key), target, key) });
}

async function turns(n: number): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise((r) => setImmediate(r));
}

/** Every chain has run to its end: 30 turns in a row with no ledger call outstanding. */
async function settle(): Promise<void> {
  for (let quiet = 0; quiet < 30; quiet = inFlight === 0 ? quiet + 1 : 0) await turns(1);
}

const stores: LedgerStore[] = [];
afterAll(async () => {
  await Promise.all(stores.map((s) => s.close()));
});

async function world(): Promise<FakeWorld> {
  const w = new FakeWorld({ BOTHY_MAX_SANDBOXES: "64" });
  const store = await openStore({ sqlitePath: ":memory:" });
  stores.push(store);
  w.ledger = roundTrips(store);
  await w.boot();
  return w;
}

const named = (w: FakeWorld, event: string, id: string): number =>
  w.events.filter((e) => e.event === event && e.fields["sandbox_id"] === id).length;

/** A refusal a caller may get when its sandbox died under it; a TransitionError means an operation raced the death's move. */
function refusedSensibly(err: unknown): void {
  expect(err).not.toBeInstanceOf(TransitionError);
  expect(err).toBeInstanceOf(BothyError);
  expect(["sandbox_not_running", "agent_unavailable"]).toContain((err as BothyError).code);
}

describe("a death during an operation, with a ledger of round trips", () => {
  it("is one death, told once, though noticed twice (channel and process)", async () => {
    const w = await world();
    const id = await w.create();
    w.host.kill(id);
    await settle();
    expect(await w.state(id)).toBe("stopped");
    expect(named(w, "sandbox_died", id)).toBe(1);
    expect(named(w, "sandbox_stop_failed", id)).toBe(0);
    expect(w.host.running(id)).toBe(false);
    expect(w.manager.ownedIds().has(id)).toBe(false);
  });

  it("a sleep under way stands back from a death, whichever turn the kill lands in", async () => {
    const w = await world();
    for (const offset of OFFSETS) {
      const id = await w.create();
      const err = await killAt(w, id, offset, () => w.manager.sleep(id));
      if (err !== undefined) refusedSensibly(err);
      await settle();
      const where = `kill at turn ${offset}`;
      expect(await w.state(id), where).toBe("stopped");
      expect(named(w, "sandbox_died", id) + named(w, "sandbox_slept", id), where).toBe(1);
      expect(named(w, "sandbox_stop_failed", id), where).toBe(0);
      expect(w.host.running(id), where).toBe(false);
      expect(w.manager.ownedIds().has(id), where).toBe(false);
    }
  });

  it("a delete under way ends in deleted, whichever turn the kill lands in", async () => {
    const w = await world();
    for (const offset of OFFSETS) {
      const id = await w.create();
      const where = `kill at turn ${offset}`;
      expect(await killAt(w, id, offset, () => w.manager.delete(id)), where).toBeUndefined();
      await settle();
      expect(await w.state(id), where).toBe("deleted");
      expect(w.host.machines.has(id), where).toBe(false);
      expect(named(w, "sandbox_stop_failed", id), where).toBe(0);
      expect(w.manager.ownedIds().has(id), where).toBe(false);
    }
  });
});
