/**
 * bothy's image downscaler (packages/guest/src/image-shrink.ts) on the host's Node, on generated
 * images only, and the tool's reading of its report.
 */
import { randomBytes } from "node:crypto";
import { crc32, deflateSync } from "node:zlib";
import jpeg from "jpeg-js";
import { PNG } from "pngjs";
import { describe, expect, it } from "vitest";
import {
  dimensionsOf,
  downscaleRgba,
  pngDataFits,
  shrinkImage,
  type ShrinkLimits,
} from "../../guest/src/image-shrink.ts";
import { failureText, pixelBudget, shrinkReport } from "../src/image-shrink.ts";

const LIMITS: ShrinkLimits = { maxSide: 1568, maxBytes: 1024 * 1024, maxPixels: 24_000_000 };

/** A PNG of random RGB pixels: incompressible, like the 4.3 MB chart of the issue. */
function noisePng(width: number, height: number): Buffer {
  const png = new PNG({ width, height });
  png.data = randomBytes(width * height * 4);
  return PNG.sync.write(png, { colorType: 2 });
}

function solidPng(width: number, height: number, rgba: [number, number, number, number]): Buffer {
  const png = new PNG({ width, height });
  for (let i = 0; i < width * height; i++) png.data.set(rgba, i * 4);
  return PNG.sync.write(png, { colorType: 6 });
}

function chunk(type: string, data: Buffer): Buffer {
  const head = Buffer.alloc(8);
  head.writeUInt32BE(data.length, 0);
  head.write(type, 4, "latin1");
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(Buffer.concat([head.subarray(4), data])));
  return Buffer.concat([head, data, crc]);
}

/** A PNG whose header claims `width`x`height` and whose pixel data is `idat`, with correct CRCs. */
function pngWithHeader(width: number, height: number, idat: Buffer, interlace = 0): Buffer {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr.set([8, 2, 0, 0, interlace], 8);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", ihdr),
    chunk("IDAT", idat),
    chunk("IEND", Buffer.alloc(0)),
  ]);
}

/** The downscaler's report, checked against the schema the tool reads it with. */
function reportOf(bytes: Buffer, limits: ShrinkLimits): unknown {
  const { report } = shrinkImage(bytes, limits);
  expect(shrinkReport.parse(report)).toEqual(report);
  return report;
}

// Decoding and encoding whole images in pure JavaScript takes seconds on a loaded 2-core host.
describe("image downscaler", { timeout: 60_000 }, () => {
  it("shrinks a 2400x600 PNG of several MB to a JPEG within the size limit", () => {
    const png = noisePng(2400, 600);
    expect(png.length).toBeGreaterThan(4 * 1024 * 1024);
    const { report, jpeg: out } = shrinkImage(png, LIMITS);
    expect(report).toMatchObject({ shrunk: true, format: "png", width: 2400, height: 600, out_width: 1568 });
    expect(report.shrunk && report.out_height).toBe(392);
    expect(out?.length).toBeLessThanOrEqual(LIMITS.maxBytes);
    const decoded = jpeg.decode(out ?? Buffer.alloc(0), { useTArray: true });
    expect([decoded.width, decoded.height]).toEqual([1568, 392]);
    expect(shrinkReport.parse(report)).toEqual(report);
  });

  it("shrinks a JPEG, keeping its colours", () => {
    const [w, h] = [2000, 1000];
    const data = Buffer.alloc(w * h * 4);
    for (let i = 0; i < w * h; i++) data.set(i % w < w / 2 ? [200, 30, 30, 255] : [30, 30, 200, 255], i * 4);
    const src = jpeg.encode({ data, width: w, height: h }, 90).data;
    const { report, jpeg: out } = shrinkImage(src, { ...LIMITS, maxSide: 400 });
    expect(report).toMatchObject({ shrunk: true, format: "jpeg", out_width: 400, out_height: 200 });
    const px = jpeg.decode(out ?? Buffer.alloc(0), { useTArray: true, formatAsRGBA: true }).data;
    const at = (x: number, y: number): number[] => [...px.subarray((y * 400 + x) * 4, (y * 400 + x) * 4 + 3)];
    for (const [got, want] of [
      [at(50, 100), [200, 30, 30]],
      [at(350, 100), [30, 30, 200]],
    ] as const)
      got.forEach((v, i) => expect(Math.abs(v - (want[i] ?? 0))).toBeLessThan(12));
  });

  it("averages areas exactly, also at ratios that are not whole numbers", () => {
    const src = new Uint8Array([0, 0, 0, 255, 100, 100, 100, 255, 200, 200, 200, 255, 40, 40, 40, 255]);
    expect([...downscaleRgba(src, 4, 1, 2, 1)]).toEqual([50, 50, 50, 255, 120, 120, 120, 255]);
    const grey = new Uint8Array(7 * 5 * 4).fill(90);
    expect(
      new Set(
        downscaleRgba(
          grey.map((v, i) => (i % 4 === 3 ? 255 : v)),
          7,
          5,
          3,
          2,
        ),
      ),
    ).toEqual(new Set([90, 255]));
  });

  it("puts transparent pixels on white, not black", () => {
    const { report, jpeg: out } = shrinkImage(solidPng(800, 800, [0, 0, 0, 0]), { ...LIMITS, maxSide: 100 });
    expect(report.shrunk).toBe(true);
    const px = jpeg.decode(out ?? Buffer.alloc(0), { useTArray: true }).data;
    expect(Math.min(...px.subarray(0, 400))).toBeGreaterThan(245);
  });

  it("refuses an image over the pixel budget from its header, before decoding", () => {
    const huge = pngWithHeader(50_000, 50_000, deflateSync(Buffer.alloc(1024)));
    expect(dimensionsOf(huge, "png")).toEqual({ width: 50_000, height: 50_000 });
    expect(reportOf(huge, LIMITS)).toEqual({
      shrunk: false,
      reason: "too_many_pixels",
      format: "png",
      width: 50_000,
      height: 50_000,
      max_pixels: LIMITS.maxPixels,
    });
  });

  it("says why when it cannot: other formats, damaged data, no copy small enough", () => {
    expect(reportOf(Buffer.from("GIF89a\x01\x00\x01\x00", "latin1"), LIMITS)).toEqual({
      shrunk: false,
      reason: "unsupported_format",
    });
    expect(reportOf(pngWithHeader(100, 100, randomBytes(5000)), LIMITS)).toMatchObject({
      shrunk: false,
      reason: "undecodable",
      format: "png",
    });
    // An interlaced PNG whose data inflates far beyond its size: refused without inflating it all.
    const bomb = pngWithHeader(100, 100, deflateSync(Buffer.alloc(16 * 1024 * 1024)), 1);
    expect(pngDataFits(bomb, 9 * 1024 * 1024)).toBe(false);
    expect(pngDataFits(bomb, 17 * 1024 * 1024)).toBe(true);
    expect(reportOf(bomb, { ...LIMITS, maxPixels: 1_000_000 })).toMatchObject({
      shrunk: false,
      reason: "undecodable",
    });
    expect(reportOf(Buffer.from([0xff, 0xd8, 0xff, 0xd9]), LIMITS)).toMatchObject({
      shrunk: false,
      reason: "no_dimensions",
    });
    expect(reportOf(noisePng(300, 300), { ...LIMITS, maxSide: 200, maxBytes: 100 })).toMatchObject({
      shrunk: false,
      reason: "output_too_large",
    });
  });

  it("finds a JPEG's size after other segments", () => {
    const src = jpeg.encode({ data: Buffer.alloc(33 * 17 * 4, 128), width: 33, height: 17 }, 80).data;
    const app = Buffer.concat([Buffer.from([0xff, 0xe1, 0x10, 0x02]), Buffer.alloc(0x1000)]);
    const withExif = Buffer.concat([src.subarray(0, 2), app, src.subarray(2)]);
    expect(dimensionsOf(withExif, "jpeg")).toEqual({ width: 33, height: 17 });
  });
});

describe("the tool's side of the downscaler", () => {
  it("sizes the pixel budget by the sandbox's memory, within bounds", () => {
    expect(pixelBudget(512)).toBeGreaterThan(8_300_000); // a 4K screenshot fits a default sandbox
    expect(pixelBudget(512)).toBeLessThan(12_000_000);
    expect(pixelBudget(128)).toBe(1_000_000);
    expect(pixelBudget(65_536)).toBe(24_000_000);
  });

  it("words every refusal so the model knows why", () => {
    const text = failureText(
      { shrunk: false, reason: "too_many_pixels", format: "png", width: 50_000, height: 50_000, max_pixels: 9_000_000 },
      "image/png",
      512,
      1024 * 1024,
    );
    expect(text).toBe(
      "it is 50000x50000 px (2500.0 million pixels), more than the 9.0 million a sandbox with 512 MiB of memory can decode safely",
    );
    expect(failureText({ shrunk: false, reason: "unsupported_format" }, "image/webp", 512, 1)).toContain("image/webp");
  });

  it("rejects a report that is not the downscaler's", () => {
    expect(shrinkReport.safeParse({ shrunk: true, format: "gif" }).success).toBe(false);
    expect(shrinkReport.safeParse({ shrunk: false, reason: "<b>do this</b>" }).success).toBe(false);
  });
});
