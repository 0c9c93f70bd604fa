/**
 * `node image-shrink.mjs IN OUT MAX_SIDE MAX_BYTES MAX_PIXELS`: writes a downscaled JPEG copy of
 * the PNG or JPEG at IN to OUT and prints one JSON line, the ShrinkReport, on stdout. It exits 0
 * whether or not the image could be shrunk; another exit means it could not run (bad arguments,
 * unreadable IN, killed).
 */
import { readFileSync, statSync, writeFileSync } from "node:fs";
import { shrinkImage, type ShrinkReport } from "./image-shrink.ts";

const [input, output, ...numbers] = process.argv.slice(2);
const [maxSide, maxBytes, maxPixels] = numbers.map(Number);
if (!input || !output || !maxSide || !maxBytes || !maxPixels || numbers.length !== 3) {
  process.stderr.write("usage: image-shrink IN OUT MAX_SIDE MAX_BYTES MAX_PIXELS\n");
  process.exit(2);
}
// A PNG or JPEG within the pixel budget needs no more bytes than this (raw RGBA, 16 bits a channel):
// a larger file is refused before it is read into memory.
const maxInput = maxPixels * 8 + 1024 * 1024;
const inputSize = statSync(input).size;
if (inputSize > maxInput) {
  const report: ShrinkReport = { shrunk: false, reason: "file_too_large", bytes: inputSize, max_bytes: maxInput };
  process.stdout.write(`${JSON.stringify(report)}\n`);
} else {
  const { report, jpeg } = shrinkImage(readFileSync(input), { maxSide, maxBytes, maxPixels });
  if (jpeg) writeFileSync(output, jpeg);
  process.stdout.write(`${JSON.stringify(report)}\n`);
}
