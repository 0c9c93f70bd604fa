import { describe, expect, it } from "vitest";
import { checkTimeout, lifetimeOf, parseSetTimeout } from "../src/sandboxes/lifetime.ts";

describe("sandbox lifetime", () => {
  const limits = {
    defaultTimeoutS: 3600,
    maxTimeoutS: 86400,
    sleepRetentionS: 2_592_000,
    disconnectGraceS: 10,
    sweepIntervalMs: 30_000,
    idleTimeoutMs: 900_000,
  };

  it("applies the defaults", () => {
    expect(lifetimeOf({}, limits)).toEqual({
      timeoutS: 3600,
      deleteOnDisconnect: false,
      disconnectGraceS: 10,
      onTimeout: "delete",
      autoWake: true,
    });
    expect(
      lifetimeOf(
        { timeout_s: 5, delete_on_disconnect: true, disconnect_grace_s: 0, on_timeout: "sleep", auto_wake: false },
        limits,
      ),
    ).toEqual({ timeoutS: 5, deleteOnDisconnect: true, disconnectGraceS: 0, onTimeout: "sleep", autoWake: false });
  });

  it("refuses out-of-range values with the range in the message", () => {
    expect(() => checkTimeout(0, 86400)).toThrow(/timeout_s must be between 1 and 86400/);
    expect(() => checkTimeout(86401, 86400)).toThrow(/BOTHY_MAX_TIMEOUT_S/);
    expect(() => lifetimeOf({ disconnect_grace_s: -1 }, limits)).toThrow(
      /disconnect_grace_s must be between 0 and 3600/,
    );
    expect(() => parseSetTimeout({ timeout_s: "60" }, 86400)).toThrow(/timeout_s: .*Expected \{"timeout_s":300\}/);
    expect(() => parseSetTimeout({ timeout_s: 60, extra: 1 }, 86400)).toThrow(/invalid_request|Unrecognized/i);
    expect(parseSetTimeout({ timeout_s: 60 }, 86400)).toBe(60);
  });
});
