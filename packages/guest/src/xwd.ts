/**
 * Reads the screen Xvfb keeps in a file (`-fbdir`): an XWD image (X Window Dump, version 7) whose
 * pixels are the live framebuffer. Only what Xvfb writes is read: a ZPixmap of 24 or 32 bits a
 * pixel with TrueColor masks.
 */

interface XwdLayout {
  width: number;
  height: number;
  /** Where the first row's pixels start, and each row's length in bytes. */
  start: number;
  bytesPerLine: number;
  bytesPerPixel: 3 | 4;
  littleEndian: boolean;
  masks: readonly [number, number, number];
  shifts: readonly [number, number, number];
}

const HEADER_FIELDS = 25;

function layout(file: Buffer): XwdLayout {
  if (file.length < HEADER_FIELDS * 4) throw new Error("the framebuffer file is shorter than an XWD header");
  const field = (i: number): number => file.readUInt32BE(i * 4);
  const [headerSize, version, format, width, height] = [field(0), field(1), field(2), field(4), field(5)];
  const bitsPerPixel = field(11);
  const bytesPerLine = field(12);
  const masks = [field(14), field(15), field(16)] as const;
  if (version !== 7 || format !== 2)
    throw new Error(`not a ZPixmap XWD v7 file (version ${version}, format ${format})`);
  if (bitsPerPixel !== 32 && bitsPerPixel !== 24) throw new Error(`${bitsPerPixel} bits a pixel is not supported`);
  const start = headerSize + field(19) * 12;
  const bytesPerPixel = bitsPerPixel / 8;
  if (width === 0 || height === 0 || bytesPerLine < width * bytesPerPixel)
    throw new Error("the framebuffer's header describes no image");
  if (start + bytesPerLine * height > file.length)
    throw new Error("the framebuffer file is shorter than its header says");
  const shift = (m: number): number => (m === 0 ? 0 : 31 - Math.clz32(m & -m));
  return {
    width,
    height,
    start,
    bytesPerLine,
    bytesPerPixel: bytesPerPixel as 3 | 4,
    littleEndian: field(7) === 0,
    masks,
    shifts: [shift(masks[0]), shift(masks[1]), shift(masks[2])],
  };
}

export function xwdSize(file: Buffer): { width: number; height: number } {
  const { width, height } = layout(file);
  return { width, height };
}

/**
 * The screen as PNG scanlines: for each row a filter byte (0) and then R, G, B per pixel. Xvfb's
 * usual layout (32 bits, little-endian, red in bits 16-23) is copied byte by byte; any other goes
 * through the masks.
 */
export function xwdToRgbRows(file: Buffer): { width: number; height: number; rows: Buffer } {
  const l = layout(file);
  const rowBytes = 1 + l.width * 3;
  const rows = Buffer.alloc(l.height * rowBytes);
  const usual =
    l.bytesPerPixel === 4 && l.littleEndian && l.masks[0] === 0xff0000 && l.masks[1] === 0xff00 && l.masks[2] === 0xff;
  for (let y = 0; y < l.height; y++) {
    let src = l.start + y * l.bytesPerLine;
    let dst = y * rowBytes + 1;
    if (usual) {
      for (let x = 0; x < l.width; x++, src += 4, dst += 3) {
        rows[dst] = file[src + 2]!;
        rows[dst + 1] = file[src + 1]!;
        rows[dst + 2] = file[src]!;
      }
      continue;
    }
    for (let x = 0; x < l.width; x++, src += l.bytesPerPixel, dst += 3) {
      const pixel = l.littleEndian ? file.readUIntLE(src, l.bytesPerPixel) : file.readUIntBE(src, l.bytesPerPixel);
      rows[dst] = (pixel & l.masks[0]) >>> l.shifts[0];
      rows[dst + 1] = (pixel & l.masks[1]) >>> l.shifts[1];
      rows[dst + 2] = (pixel & l.masks[2]) >>> l.shifts[2];
    }
  }
  return { width: l.width, height: l.height, rows };
}
