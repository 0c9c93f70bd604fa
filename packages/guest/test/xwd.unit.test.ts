import { describe, expect, it } from "vitest";
import { PNG } from "pngjs";
import { encodeRgbPng } from "../src/png.ts";
import { xwdSize, xwdToRgbRows } from "../src/xwd.ts";

/** An XWD v7 ZPixmap as Xvfb writes it: 25 big-endian header fields, a window name, a colormap, pixels. */
function xwd(
  width: number,
  height: number,
  pixels: number[],
  opts: { byteOrder?: 0 | 1; bpp?: 24 | 32; ncolors?: number; pad?: number } = {},
): Buffer {
  const { byteOrder = 0, bpp = 32, ncolors = 0, pad = 0 } = opts;
  const name = Buffer.from("Xvfb main window\0");
  const headerSize = 100 + name.length;
  const bytes = bpp / 8;
  const bytesPerLine = width * bytes + pad;
  const header = Buffer.alloc(100);
  const fields = [headerSize, 7, 2, 24, width, height, 0, byteOrder, 32, byteOrder, 32, bpp, bytesPerLine, 4];
  fields.forEach((v, i) => header.writeUInt32BE(v, i * 4));
  header.writeUInt32BE(0xff0000, 14 * 4);
  header.writeUInt32BE(0x00ff00, 15 * 4);
  header.writeUInt32BE(0x0000ff, 16 * 4);
  header.writeUInt32BE(8, 17 * 4);
  header.writeUInt32BE(256, 18 * 4);
  header.writeUInt32BE(ncolors, 19 * 4);
  const data = Buffer.alloc(bytesPerLine * height);
  pixels.forEach((p, i) => {
    const at = Math.floor(i / width) * bytesPerLine + (i % width) * bytes;
    if (bytes === 4 && byteOrder === 0) data.writeUInt32LE(p, at);
    else if (bytes === 4) data.writeUInt32BE(p, at);
    else if (byteOrder === 0) data.writeUIntLE(p, at, 3);
    else data.writeUIntBE(p, at, 3);
  });
  return Buffer.concat([header, name, Buffer.alloc(ncolors * 12), data]);
}

/** PNG scanlines (filter byte 0, then RGB) of the given pixels, row by row. */
const rows = (width: number, pixels: number[][]): number[] =>
  pixels.flatMap((p, i) => (i % width === 0 ? [0, ...p] : p));

describe("xwdToRgbRows", () => {
  it("reads Xvfb's little-endian 32-bit framebuffer through its masks, row padding skipped", () => {
    const out = xwdToRgbRows(xwd(2, 2, [0xff8000, 0x008080, 0x000000, 0xffffff], { ncolors: 3, pad: 4 }));
    expect([out.width, out.height]).toEqual([2, 2]);
    expect([...out.rows]).toEqual(
      rows(2, [
        [255, 128, 0],
        [0, 128, 128],
        [0, 0, 0],
        [255, 255, 255],
      ]),
    );
  });

  it("reads big-endian and 24-bit pixels", () => {
    expect([...xwdToRgbRows(xwd(1, 1, [0x123456], { byteOrder: 1 })).rows]).toEqual([0, 0x12, 0x34, 0x56]);
    expect([...xwdToRgbRows(xwd(1, 1, [0x123456], { bpp: 24 })).rows]).toEqual([0, 0x12, 0x34, 0x56]);
  });

  it("refuses what it cannot read instead of reading past the file", () => {
    expect(() => xwdSize(Buffer.alloc(10))).toThrow(/shorter than an XWD header/);
    const whole = xwd(4, 4, []);
    expect(() => xwdToRgbRows(whole.subarray(0, whole.length - 1))).toThrow(/shorter than its header says/);
    const v6 = Buffer.from(whole);
    v6.writeUInt32BE(6, 4);
    expect(() => xwdSize(v6)).toThrow(/not a ZPixmap XWD v7/);
  });
});

describe("encodeRgbPng", () => {
  it("writes a PNG another decoder reads back pixel for pixel", async () => {
    const width = 37;
    const height = 11;
    const pixels = Array.from({ length: width * height }, (_, i) => (i * 2654435761) & 0xffffff);
    const { rows: scanlines } = xwdToRgbRows(xwd(width, height, pixels));
    const decoded = PNG.sync.read(await encodeRgbPng(width, height, scanlines));
    expect([decoded.width, decoded.height]).toEqual([width, height]);
    const expected = pixels.flatMap((p) => [(p >> 16) & 0xff, (p >> 8) & 0xff, p & 0xff, 255]);
    expect([...decoded.data]).toEqual(expected);
  });
});
