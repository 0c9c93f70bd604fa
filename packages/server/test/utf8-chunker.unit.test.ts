import { describe, expect, it } from "vitest";
import { Utf8Chunker } from "../src/util/utf8-chunker.ts";

describe("Utf8Chunker", () => {
  it("passes text through", () => {
    expect(new Utf8Chunker().push(Buffer.from("hello"))).toEqual({ data: "hello" });
  });

  it("holds back a character split across chunks", () => {
    const c = new Utf8Chunker();
    const snow = Buffer.from("a☃b"); // ☃ is 3 bytes
    expect(c.push(snow.subarray(0, 2))).toEqual({ data: "a" });
    expect(c.push(snow.subarray(2, 3))).toBeUndefined();
    expect(c.push(snow.subarray(3))).toEqual({ data: "☃b" });
    expect(c.flush()).toBeUndefined();
  });

  it("sends invalid bytes as base64", () => {
    const c = new Utf8Chunker();
    expect(c.push(Buffer.from([0xff, 0x41]))).toEqual({
      data: Buffer.from([0xff, 0x41]).toString("base64"),
      encoding: "base64",
    });
  });

  it("flushes a dangling partial character as base64", () => {
    const c = new Utf8Chunker();
    expect(c.push(Buffer.from([0x41, 0xe2, 0x98]))).toEqual({ data: "A" });
    expect(c.flush()).toEqual({ data: Buffer.from([0xe2, 0x98]).toString("base64"), encoding: "base64" });
  });

  it("handles 4-byte characters", () => {
    const c = new Utf8Chunker();
    const emoji = Buffer.from("😀");
    expect(c.push(emoji.subarray(0, 3))).toBeUndefined();
    expect(c.push(emoji.subarray(3))).toEqual({ data: "😀" });
  });
});
