import { describe, expect, it } from "vitest";
import { createProgressRenderer, sanitizeLine, truncate } from "../src/progress.ts";

function capture(
  isTTY: boolean,
  columns = 40,
): { out: { write: (s: string) => void; isTTY: boolean; columns: number }; text: () => string } {
  let text = "";
  return { out: { write: (s) => void (text += s), isTTY, columns }, text: () => text };
}

describe("progress renderer", () => {
  it("writes one plain line per step and per subprocess line when not on a terminal", () => {
    const { out, text } = capture(false);
    const r = createProgressRenderer(out);
    r.update({ step: 1, steps: 3, title: "debootstrap" });
    r.update({ step: 1, steps: 3, title: "debootstrap", line: "I: Retrieving \x1b[1mlibc6\x1b[0m" });
    r.update({ step: 2, steps: 3, title: "apt install", line: "Get:1 http://deb.debian.org" });
    r.finish();
    expect(text()).toBe("[1/3] debootstrap\n  I: Retrieving libc6\n[2/3] apt install\n  Get:1 http://deb.debian.org\n");
  });

  it("redraws one status line in place on a terminal and keeps finished steps", () => {
    const { out, text } = capture(true, 40);
    let now = 0;
    const r = createProgressRenderer(out, () => now);
    r.update({ step: 1, steps: 2, title: "debootstrap" });
    now = 1500;
    r.update({ step: 1, steps: 2, title: "debootstrap", line: "I: Retrieving a-package-with-a-very-long-name 1.0" });
    now = 4000;
    r.update({ step: 2, steps: 2, title: "finalize" });
    r.finish();
    const frames = text()
      .split("\r\x1b[2K")
      .filter((f) => f !== "");
    expect(frames).toEqual([
      "[1/2] debootstrap  0.0s",
      "[1/2] debootstrap  1.5s  I: Retrieving…",
      "[1/2] debootstrap  4.0s\n",
      "[2/2] finalize  0.0s",
      "[2/2] finalize  0.0s\n",
    ]);
    expect(frames.every((f) => Array.from(f.replace("\n", "")).length <= 39)).toBe(true);
  });

  it("strips control sequences and cuts by code points", () => {
    expect(sanitizeLine("\x1b[31mred\x1b[0m\tdone\r")).toBe("red done");
    expect(truncate("héllo wörld", 6)).toBe("héllo…");
    expect(truncate("short", 10)).toBe("short");
  });
});
