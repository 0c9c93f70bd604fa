import { describe, expect, it } from "vitest";
import { Wakeup } from "../src/util/wakeup.ts";

describe("Wakeup", () => {
  it("answers true when the idle time passes unwoken (a wake with no waiter is forgotten), false when woken", async () => {
    const w = new Wakeup();
    w.wake();
    expect(await w.wait(1)).toBe(true);
    const woken = w.wait(undefined);
    w.wake();
    expect(await woken).toBe(false);
  });
});
