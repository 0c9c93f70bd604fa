/**
 * Renders template build progress. On a terminal: one status line redrawn in place, each finished
 * step left above it with its duration. Elsewhere (logs, CI): one plain line per step and per
 * subprocess line, nothing redrawn.
 */
import type { BuildProgress } from "@bothy/server";

export interface ProgressOutput {
  write(text: string): unknown;
  isTTY?: boolean;
  columns?: number;
}

export interface ProgressRenderer {
  update(ev: BuildProgress): void;
  /** Ends the live line; safe to call more than once. */
  finish(): void;
}

const REDRAW_MS = 100;

/** Subprocess output may carry colours, cursor movement and tabs: none of it survives a status line. */
// Matching control characters is the point of these two expressions.
// eslint-disable-next-line no-control-regex
const ANSI_SEQUENCE = /\x1b\[[0-9;?]*[ -/]*[@-~]/g;
// eslint-disable-next-line no-control-regex
const CONTROL_CHAR = /[\x00-\x1f\x7f]/g;

export function sanitizeLine(line: string): string {
  return line.replace(ANSI_SEQUENCE, "").replace(/\t/g, " ").replace(CONTROL_CHAR, "").trim();
}

/** Cuts to `width` code points, with an ellipsis when cut. */
export function truncate(text: string, width: number): string {
  const chars = Array.from(text);
  if (chars.length <= width) return text;
  if (width <= 1) return chars.slice(0, Math.max(0, width)).join("");
  return `${chars.slice(0, width - 1).join("")}…`;
}

function stepLabel(ev: BuildProgress): string {
  return ev.steps > 0 ? `[${ev.step}/${ev.steps}] ${ev.title}` : `[..] ${ev.title}`;
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(1)}s`;
}

export function createProgressRenderer(
  out: ProgressOutput = process.stderr,
  now: () => number = Date.now,
): ProgressRenderer {
  return out.isTTY === true ? new LiveRenderer(out, now) : new PlainRenderer(out);
}

class PlainRenderer implements ProgressRenderer {
  private current = "";

  constructor(private readonly out: ProgressOutput) {}

  update(ev: BuildProgress): void {
    const label = stepLabel(ev);
    if (label !== this.current) {
      this.current = label;
      this.out.write(`${label}\n`);
    }
    if (ev.line !== undefined) {
      const line = sanitizeLine(ev.line);
      if (line !== "") this.out.write(`  ${line}\n`);
    }
  }

  finish(): void {
    this.current = "";
  }
}

class LiveRenderer implements ProgressRenderer {
  private label: string | undefined;
  private startedAt = 0;
  private lastLine = "";
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly out: ProgressOutput,
    private readonly now: () => number,
  ) {}

  update(ev: BuildProgress): void {
    const label = stepLabel(ev);
    if (label !== this.label) {
      this.settle();
      this.label = label;
      this.startedAt = this.now();
      this.lastLine = "";
      // The elapsed time must move even while a step prints nothing (apt resolving, cp copying).
      this.timer ??= setInterval(() => this.draw(), REDRAW_MS).unref();
    }
    if (ev.line !== undefined) {
      const line = sanitizeLine(ev.line);
      if (line !== "") this.lastLine = line;
    }
    this.draw();
  }

  finish(): void {
    this.settle();
    this.label = undefined;
    clearInterval(this.timer);
    this.timer = undefined;
  }

  /** Leaves the finished step on its own line, with how long it took. */
  private settle(): void {
    if (this.label === undefined) return;
    this.out.write(`\r\x1b[2K${this.label}  ${seconds(this.now() - this.startedAt)}\n`);
  }

  private draw(): void {
    if (this.label === undefined) return;
    const head = `${this.label}  ${seconds(this.now() - this.startedAt)}`;
    // One column short of the width: writing into the last column wraps on some terminals.
    const width = (this.out.columns ?? 80) - 1;
    const text = this.lastLine === "" ? head : `${head}  ${this.lastLine}`;
    this.out.write(`\r\x1b[2K${truncate(text, width)}`);
  }
}
