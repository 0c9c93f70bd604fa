/**
 * Reads the screen Xvfb keeps in a file (`-fbdir`): an XWD image (X Window Dump, version 7) whose
 * pixels are the live framebuffer. Only what Xvfb writes is read: a ZPixmap of 24 or 32 bits a
 * pixel with TrueColor masks.
 */

export interface Rgba {
  width: number;
  height: number;
  /** width * height * 4 bytes, alpha 255. */
  data: Buffer;
}

const HEADER_FIELDS = 25;

export function xwdToRgba(file: Buffer): Rgba {
  if (file.length < HEADER_FIELDS * 4) throw new Error("the framebuffer file is shorter than an XWD header");
  const field = (i: number): number => file.readUInt32BE(i * 4);
  const [headerSize, version, format, , width, height] = [0, 1, 2, 3, 4, 5].map(field) as [
    number,
    number,
    number,
    number,
    number,
    number,
  ];
  const byteOrder = field(7);
  const bitsPerPixel = field(11);
  const bytesPerLine = field(12);
  const masks = [field(14), field(15), field(16)] as const;
  const ncolors = field(19);
  if (version !== 7 || format !== 2)
    throw new Error(`not a ZPixmap XWD v7 file (version ${version}, format ${format})`);
  if (bitsPerPixel !== 32 && bitsPerPixel !== 24) throw new Error(`${bitsPerPixel} bits a pixel is not supported`);
  const start = headerSize + ncolors * 12;
  if (width === 0 || height === 0 || start + bytesPerLine * height > file.length)
    throw new Error("the framebuffer file is shorter than its header says");
  const shifts = masks.map((m) => (m === 0 ? 0 : 31 - Math.clz32(m & -m)));
  const bytes = bitsPerPixel / 8;
  const data = Buffer.alloc(width * height * 4);
  for (let y = 0; y < height; y++) {
    let src = start + y * bytesPerLine;
    let dst = y * width * 4;
    for (let x = 0; x < width; x++, src += bytes, dst += 4) {
      const pixel =
        bytes === 4
          ? byteOrder === 0
            ? file.readUInt32LE(src)
            : file.readUInt32BE(src)
          : byteOrder === 0
            ? file.readUIntLE(src, 3)
            : file.readUIntBE(src, 3);
      data[dst] = (pixel & masks[0]) >>> shifts[0]!;
      data[dst + 1] = (pixel & masks[1]) >>> shifts[1]!;
      data[dst + 2] = (pixel & masks[2]) >>> shifts[2]!;
      data[dst + 3] = 255;
    }
  }
  return { width, height, data };
}
