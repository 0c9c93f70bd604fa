/**
 * A PNG encoder for screenshots, fast rather than small: 8-bit RGB, no interlace, every row with
 * filter 0, deflated at level 1 on zlib's thread pool. A 1280x800 desktop encodes in a few
 * milliseconds to tens of kilobytes (flat screens compress well without filters).
 */
import { deflate } from "node:zlib";
import { promisify } from "node:util";

const SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
const deflateAsync = promisify(deflate);

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

function crc32(parts: readonly Buffer[]): number {
  let c = 0xffffffff;
  for (const part of parts) for (let i = 0; i < part.length; i++) c = CRC_TABLE[(c ^ part[i]!) & 0xff]! ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function chunk(type: string, data: Buffer): Buffer {
  const head = Buffer.alloc(8);
  head.writeUInt32BE(data.length, 0);
  head.write(type, 4, "latin1");
  const tail = Buffer.alloc(4);
  tail.writeUInt32BE(crc32([head.subarray(4), data]), 0);
  return Buffer.concat([head, data, tail]);
}

/** `rows`: height rows of a filter byte then width * 3 bytes of RGB (see xwdToRgbRows). */
export async function encodeRgbPng(width: number, height: number, rows: Buffer): Promise<Buffer> {
  if (rows.length !== height * (1 + width * 3)) throw new Error("the rows do not match the image's size");
  const header = Buffer.alloc(13);
  header.writeUInt32BE(width, 0);
  header.writeUInt32BE(height, 4);
  header[8] = 8; // bits per channel
  header[9] = 2; // RGB
  const idat = await deflateAsync(rows, { level: 1 });
  return Buffer.concat([SIGNATURE, chunk("IHDR", header), chunk("IDAT", idat), chunk("IEND", Buffer.alloc(0))]);
}
