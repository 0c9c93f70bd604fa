import { describe, expect, it } from "vitest";
import { toPublicEvent } from "../src/events/public-events.ts";
import { ServerEvents, type ServerEvent } from "../src/events/server-events.ts";

describe("server events", () => {
  it("reach every subscriber as one typed object, in order", () => {
    const bus = new ServerEvents();
    const a: ServerEvent[] = [];
    const b: string[] = [];
    bus.subscribe((ev) => a.push(ev));
    const stop = bus.subscribe((ev) => b.push(ev.event));
    bus.emit("sandbox_paused", { sandbox_id: "sbx_a" });
    stop();
    bus.emit("sandbox_resumed", { sandbox_id: "sbx_a" });
    expect(a).toEqual([
      { event: "sandbox_paused", sandbox_id: "sbx_a" },
      { event: "sandbox_resumed", sandbox_id: "sbx_a" },
    ]);
    expect(b).toEqual(["sandbox_paused"]);
  });

  it("become the public events clients see, and only those", () => {
    expect(toPublicEvent({ event: "sandbox_died", sandbox_id: "sbx_a", code: 1, signal: null })).toEqual({
      type: "sandbox.stopped",
      sandboxId: "sbx_a",
      data: { sandbox_id: "sbx_a", code: 1, signal: null, reason: "sandbox_died" },
    });
    expect(toPublicEvent({ event: "sandbox_deleted", sandbox_id: "sbx_a", reason: "requested" })).toEqual({
      type: "sandbox.deleted",
      sandboxId: "sbx_a",
      data: { sandbox_id: "sbx_a", reason: "requested" },
    });
    expect(toPublicEvent({ event: "sandbox_paused", sandbox_id: "sbx_a" })).toBeUndefined();
    expect(toPublicEvent({ event: "sweep_failed", error: "x" })).toBeUndefined();
  });
});
