import { describe, expect, it } from "vitest";
import { ReplayBuffer } from "../src/commands/replay-buffer.ts";

const out = (data: string, encoding?: "base64") => ({
  type: "stdout" as const,
  command_id: "c",
  data,
  ...(encoding ? { encoding } : {}),
});

describe("ReplayBuffer", () => {
  it("keeps everything under the limit, with no drop marker", () => {
    const b = new ReplayBuffer(10);
    b.push(out("abc"));
    b.push(out("def"));
    expect(b.replay("c")).toEqual([out("abc"), out("def")]);
  });

  it("drops the oldest chunks and counts their bytes", () => {
    const b = new ReplayBuffer(6);
    b.push(out("aaaa"));
    b.push(out("bbbb"));
    b.push(out("cc"));
    expect(b.replay("c")).toEqual([{ type: "output_dropped", command_id: "c", bytes: 4 }, out("bbbb"), out("cc")]);
  });

  it("keeps the tail of a chunk larger than the buffer", () => {
    const b = new ReplayBuffer(4);
    b.push(out("0123456789"));
    expect(b.replay("c")).toEqual([{ type: "output_dropped", command_id: "c", bytes: 6 }, out("6789")]);
  });

  it("cuts binary chunks on whole base64 quads", () => {
    const b = new ReplayBuffer(8);
    const data = Buffer.from([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]).toString("base64"); // 16 chars
    b.push(out(data, "base64"));
    const [marker, kept] = b.replay("c");
    expect(marker).toEqual({ type: "output_dropped", command_id: "c", bytes: 6 });
    expect(Buffer.from((kept as { data: string }).data, "base64")).toEqual(Buffer.from([7, 8, 9, 10, 11, 12]));
  });
});
