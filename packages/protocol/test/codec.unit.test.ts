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

  it("seeks past the tail of a cut frame to the next marked frame, in pieces, and skips look-alikes", () => {
    const marker = Buffer.from('{"t":"hello"');
    const fits = (head: number, payload: number): boolean => head <= 1024 && payload === 0;
    const cut = encodeFrame(
      { t: "output", id: 7, fd: 1 },
      Buffer.from('padding {"t":"hello" inside a payload'),
    ).subarray(5);
    const hello = encodeFrame({ t: "hello", gen: 1 });
    const after = encodeFrame({ t: "output", id: 8, fd: 1 }, Buffer.from("next"));
    const stream = Buffer.concat([cut, hello, after]);
    const d = new FrameDecoder();
    let found = false;
    let i = 0;
    // Byte by byte: the marker may arrive split over reads.
    for (; i < stream.length && !found; i++) {
      d.append(stream.subarray(i, i + 1));
      found = d.seek(marker, fits);
    }
    expect(found).toBe(true);
    const frames = [...d.decode(), ...d.push(stream.subarray(i))];
    expect(frames.map((f) => f.header)).toEqual([
      { t: "hello", gen: 1 },
      { t: "output", id: 8, fd: 1 },
    ]);
    expect(frames[1]?.payload.toString()).toBe("next");
  });
});
