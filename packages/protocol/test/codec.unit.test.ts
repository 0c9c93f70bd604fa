import { describe, expect, it } from "vitest";
import { encodeFrame, FrameDecoder, FrameError, MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES } from "../src/index.ts";

describe("frame codec", () => {
  it("round-trips header and payload", () => {
    const frame = encodeFrame({ t: "output", id: 1, fd: 1 }, Buffer.from("hello"));
    const [out] = new FrameDecoder().push(frame);
    expect(out?.header).toEqual({ t: "output", id: 1, fd: 1 });
    expect(out?.payload.toString()).toBe("hello");
  });

  it("reassembles frames split at every byte and several frames in one chunk", () => {
    const a = encodeFrame({ t: "a" }, Buffer.from([1, 2, 3]));
    const b = encodeFrame({ t: "b" });
    const all = Buffer.concat([a, b, a]);
    const dec = new FrameDecoder();
    const got = [];
    for (let i = 0; i < all.length; i++) got.push(...dec.push(all.subarray(i, i + 1)));
    expect(got.map((f) => (f.header as { t: string }).t)).toEqual(["a", "b", "a"]);
    expect([...(got[2]?.payload ?? [])]).toEqual([1, 2, 3]);
    expect(dec.bufferedBytes).toBe(0);
    expect(new FrameDecoder().push(all)).toHaveLength(3);
  });

  it("refuses to encode oversized frames", () => {
    expect(() => encodeFrame({ t: "x" }, Buffer.alloc(MAX_PAYLOAD_BYTES + 1))).toThrow(FrameError);
    expect(() => encodeFrame({ t: "x".repeat(MAX_HEADER_BYTES) })).toThrow(FrameError);
  });

  it("rejects an oversized length prefix before buffering the body", () => {
    const prefix = Buffer.alloc(8);
    prefix.writeUInt32BE(10, 0);
    prefix.writeUInt32BE(MAX_PAYLOAD_BYTES + 1, 4);
    expect(() => new FrameDecoder().push(prefix)).toThrow(/exceeds/);
    const big = Buffer.alloc(8);
    big.writeUInt32BE(MAX_HEADER_BYTES + 1, 0);
    expect(() => new FrameDecoder().push(big)).toThrow(/out of range/);
    expect(() => new FrameDecoder().push(Buffer.alloc(8))).toThrow(/out of range/);
  });

  it("rejects a header that is not JSON", () => {
    const head = Buffer.from("{nope");
    const prefix = Buffer.alloc(8);
    prefix.writeUInt32BE(head.length, 0);
    expect(() => new FrameDecoder().push(Buffer.concat([prefix, head]))).toThrow(/not valid JSON/);
  });
});
