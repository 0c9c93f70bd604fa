/**
 * bothy's image downscaler: PNG or JPEG in, a smaller JPEG out, in pure JavaScript so it runs on
 * the template's own Node whatever else the template holds. It runs inside a sandbox (the bytes
 * are the sandbox's, so untrusted), never in the server. Memory is bounded by a pixel budget
 * checked from the header before anything is decoded.
 */
import { inflateSync } from "node:zlib";
import jpeg from "jpeg-js";
import { PNG } from "pngjs";

export interface ShrinkLimits {
  /** Longest side of the copy, in pixels. */
  maxSide: number;
  /** The copy's size in bytes must not exceed this. */
  maxBytes: number;
  /** Images with more pixels than this are refused before decoding. */
  maxPixels: number;
}

export type ImageFormat = "png" | "jpeg";

/** Why an image was not shrunk; the tool that asked words the message from this. */
export type ShrinkFailure =
  "unsupported_format" | "no_dimensions" | "too_many_pixels" | "undecodable" | "output_too_large" | "file_too_large";

export type ShrinkReport =
  | {
      shrunk: true;
      format: ImageFormat;
      width: number;
      height: number;
      out_width: number;
      out_height: number;
      out_bytes: number;
      quality: number;
    }
  | {
      shrunk: false;
      reason: ShrinkFailure;
      format?: ImageFormat;
      width?: number;
      height?: number;
      max_pixels?: number;
      bytes?: number;
      max_bytes?: number;
    };

const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
/** Lower qualities are tried, in order, before the copy is made smaller still. */
const QUALITIES = [85, 70, 55];
const MIN_SIDE = 64;

export function formatOf(bytes: Uint8Array): ImageFormat | undefined {
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (b.length >= 8 && b.subarray(0, 8).equals(PNG_SIGNATURE)) return "png";
  if (b.length >= 3 && b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff) return "jpeg";
  return undefined;
}

/** Width and height from the header alone (PNG's IHDR, JPEG's first SOF segment). */
export function dimensionsOf(bytes: Uint8Array, format: ImageFormat): { width: number; height: number } | undefined {
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (format === "png") {
    if (b.length < 24 || b.toString("latin1", 12, 16) !== "IHDR") return undefined;
    return { width: b.readUInt32BE(16), height: b.readUInt32BE(20) };
  }
  let at = 2;
  while (at + 4 <= b.length) {
    if (b[at] !== 0xff) return undefined;
    const marker = b[at + 1] ?? 0;
    // Fill bytes and markers without a length (RSTn, TEM) carry no segment.
    if (marker === 0xff) {
      at += 1;
      continue;
    }
    if ((marker >= 0xd0 && marker <= 0xd7) || marker === 0x01) {
      at += 2;
      continue;
    }
    const length = b.readUInt16BE(at + 2);
    const isSof = marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc;
    if (isSof) {
      if (at + 9 > b.length) return undefined;
      return { width: b.readUInt16BE(at + 7), height: b.readUInt16BE(at + 5) };
    }
    if (length < 2) return undefined;
    at += 2 + length;
  }
  return undefined;
}

/** The copy's size: the longest side at most `maxSide`, never larger than the original. */
export function fitWithin(width: number, height: number, maxSide: number): { width: number; height: number } {
  const scale = Math.min(1, maxSide / Math.max(width, height));
  return { width: Math.max(1, Math.round(width * scale)), height: Math.max(1, Math.round(height * scale)) };
}

/**
 * Area-average downscale of RGBA pixels onto a white background (transparency would turn black
 * in a JPEG). It only shrinks, so each source pixel covers at most two destination cells per
 * axis; the weights of a destination cell sum to one.
 */
export function downscaleRgba(
  src: Uint8Array,
  width: number,
  height: number,
  outWidth: number,
  outHeight: number,
): Uint8Array {
  const xs = coverage(width, outWidth);
  const ys = coverage(height, outHeight);
  const acc = new Float32Array(outWidth * outHeight * 3);
  const row = new Float32Array(outWidth * 3);
  for (let y = 0; y < height; y++) {
    row.fill(0);
    for (let x = 0; x < width; x++) {
      const i = (y * width + x) * 4;
      const a = (src[i + 3] ?? 255) / 255;
      const white = 255 * (1 - a);
      const r = (src[i] ?? 0) * a + white;
      const g = (src[i + 1] ?? 0) * a + white;
      const b = (src[i + 2] ?? 0) * a + white;
      const c = (xs.cell[x] ?? 0) * 3;
      const w0 = xs.first[x] ?? 0;
      const w1 = xs.scale - w0;
      row[c] = (row[c] ?? 0) + r * w0;
      row[c + 1] = (row[c + 1] ?? 0) + g * w0;
      row[c + 2] = (row[c + 2] ?? 0) + b * w0;
      if (w1 > 0 && c + 5 < row.length) {
        row[c + 3] = (row[c + 3] ?? 0) + r * w1;
        row[c + 4] = (row[c + 4] ?? 0) + g * w1;
        row[c + 5] = (row[c + 5] ?? 0) + b * w1;
      }
    }
    const cell = ys.cell[y] ?? 0;
    const w0 = ys.first[y] ?? 0;
    const w1 = ys.scale - w0;
    addRow(acc, row, cell * row.length, w0);
    if (w1 > 0 && cell + 1 < outHeight) addRow(acc, row, (cell + 1) * row.length, w1);
  }
  const out = new Uint8Array(outWidth * outHeight * 4);
  for (let p = 0; p < outWidth * outHeight; p++) {
    out[p * 4] = Math.round(acc[p * 3] ?? 0);
    out[p * 4 + 1] = Math.round(acc[p * 3 + 1] ?? 0);
    out[p * 4 + 2] = Math.round(acc[p * 3 + 2] ?? 0);
    out[p * 4 + 3] = 255;
  }
  return out;
}

function addRow(acc: Float32Array, row: Float32Array, base: number, weight: number): void {
  for (let k = 0; k < row.length; k++) acc[base + k] = (acc[base + k] ?? 0) + (row[k] ?? 0) * weight;
}

/**
 * For each of `n` source indices: the first destination cell it covers and its share there (the
 * rest of `scale`, its whole share, goes to the next cell).
 */
function coverage(n: number, cells: number): { cell: Int32Array; first: Float64Array; scale: number } {
  const scale = cells / n;
  const cell = new Int32Array(n);
  const first = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    const from = i * scale;
    const c = Math.min(cells - 1, Math.floor(from));
    cell[i] = c;
    first[i] = c === cells - 1 ? scale : Math.min((i + 1) * scale, c + 1) - from;
  }
  return { cell, first, scale };
}

function decode(
  bytes: Buffer,
  format: ImageFormat,
  maxPixels: number,
): { data: Uint8Array; width: number; height: number } {
  if (format === "png") {
    // pngjs bounds what it inflates only for images that are not interlaced: bound the rest here.
    if (bytes[28] === 1 && !pngDataFits(bytes, maxPixels * 8 + 1024 * 1024))
      throw new Error("the interlaced PNG's data inflates past what its size allows");
    return PNG.sync.read(bytes);
  }
  return jpeg.decode(bytes, {
    useTArray: true,
    formatAsRGBA: true,
    maxResolutionInMP: maxPixels / 1_000_000,
    // jpeg-js keeps 4 bytes per coefficient and several whole-image planes: ~38 bytes a pixel, measured.
    maxMemoryUsageInMB: Math.ceil((maxPixels * 40) / (1024 * 1024)) + 64,
  });
}

/** Whether a PNG's pixel data inflates to at most `max` bytes (false for a compression bomb), inflating no more. */
export function pngDataFits(png: Buffer, max: number): boolean {
  const idat: Buffer[] = [];
  for (let at = 8; at + 8 <= png.length;) {
    const length = png.readUInt32BE(at);
    if (png.toString("latin1", at + 4, at + 8) === "IDAT") idat.push(png.subarray(at + 8, at + 8 + length));
    at += 12 + length;
  }
  try {
    inflateSync(Buffer.concat(idat), { maxOutputLength: max });
    return true;
  } catch (err) {
    if (err instanceof RangeError) return false;
    // Damaged data: pngjs says so when it reads it.
    return true;
  }
}

/** A JPEG copy of a PNG or JPEG within `limits`, or why there is none. */
export function shrinkImage(bytes: Buffer, limits: ShrinkLimits): { report: ShrinkReport; jpeg?: Buffer } {
  const format = formatOf(bytes);
  if (!format) return { report: { shrunk: false, reason: "unsupported_format" } };
  const size = dimensionsOf(bytes, format);
  if (!size || size.width === 0 || size.height === 0)
    return { report: { shrunk: false, reason: "no_dimensions", format } };
  const { width, height } = size;
  if (width * height > limits.maxPixels)
    return {
      report: { shrunk: false, reason: "too_many_pixels", format, width, height, max_pixels: limits.maxPixels },
    };
  let image: { data: Uint8Array; width: number; height: number };
  try {
    image = decode(bytes, format, limits.maxPixels);
  } catch {
    return { report: { shrunk: false, reason: "undecodable", format, width, height } };
  }
  // The header and the decoder can disagree on a crafted file: the decoded pixels are what count.
  if (image.width * image.height > limits.maxPixels || image.data.length < image.width * image.height * 4)
    return { report: { shrunk: false, reason: "undecodable", format, width, height } };

  for (let side = limits.maxSide; side >= MIN_SIDE; side = Math.floor(side * 0.75)) {
    const out = fitWithin(image.width, image.height, side);
    const pixels = downscaleRgba(image.data, image.width, image.height, out.width, out.height);
    for (const quality of QUALITIES) {
      const encoded = jpeg.encode({ data: pixels, width: out.width, height: out.height }, quality).data;
      if (encoded.length <= limits.maxBytes)
        return {
          report: {
            shrunk: true,
            format,
            width: image.width,
            height: image.height,
            out_width: out.width,
            out_height: out.height,
            out_bytes: encoded.length,
            quality,
          },
          jpeg: encoded,
        };
    }
  }
  return { report: { shrunk: false, reason: "output_too_large", format, width, height } };
}
