/**
 * A progress bar for byte copies (`bothy cp`): on a terminal one line redrawn at most every
 * 100 ms with percent, size and rate; elsewhere silent, so pipes and logs stay clean.
 */
import type { ProgressOutput } from "./progress.ts";

export interface ByteProgress {
  add(bytes: number): void;
  finish(): void;
}

const REDRAW_MS = 100;

export function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(1)} ${units[i]}`;
}

/** The bar's text for `done` of `total` bytes (total unknown: no bar, just the count). */
export function renderBar(
  label: string,
  done: number,
  total: number | undefined,
  elapsedMs: number,
  width: number,
): string {
  const rate = elapsedMs > 0 ? `${formatBytes(Math.round((done * 1000) / elapsedMs))}/s` : "";
  const tail =
    total === undefined
      ? `${formatBytes(done)}  ${rate}`
      : `${Math.floor((done / Math.max(total, 1)) * 100)}%  ${formatBytes(done)}/${formatBytes(total)}  ${rate}`;
  const room = width - label.length - tail.length - 5;
  if (total === undefined || room < 10) return `${label}  ${tail}`.slice(0, width);
  const bar = Math.min(room, 40);
  const filled = Math.round((Math.min(done, total) / Math.max(total, 1)) * bar);
  return `${label} [${"#".repeat(filled)}${".".repeat(bar - filled)}] ${tail}`;
}

export function createByteProgress(
  label: string,
  total: number | undefined,
  out: ProgressOutput = process.stderr,
  now: () => number = Date.now,
): ByteProgress {
  if (out.isTTY !== true) return { add: () => undefined, finish: () => undefined };
  const started = now();
  let done = 0;
  let drawn = 0;
  const draw = (): void => {
    drawn = now();
    out.write(`\r\x1b[2K${renderBar(label, done, total, drawn - started, (out.columns ?? 80) - 1)}`);
  };
  return {
    add(bytes) {
      done += bytes;
      if (now() - drawn >= REDRAW_MS) draw();
    },
    finish() {
      draw();
      out.write("\n");
    },
  };
}
