/**
 * Finding secrets and placeholders in streams that arrive in pieces: a match split over two
 * chunks is still found, because the last (longest needle - 1) bytes are held back until the
 * next chunk or the end shows whether they begin one.
 */
import { Transform, type TransformCallback } from "node:stream";

export interface Needle {
  bytes: Buffer;
  /** What replaces it in the output. */
  replacement: Buffer;
  /** Reported when it is found (a secret's name). */
  id: string;
}

/** Replaces every needle in a stream of chunks, leftmost first (the longest where two start together). */
export class StreamMatcher {
  private pending = Buffer.alloc(0);
  private readonly hold: number;

  constructor(private readonly needles: Needle[]) {
    this.hold = Math.max(0, ...needles.map((n) => n.bytes.length - 1));
  }

  /** The output so far and the ids of the needles found in this chunk. */
  push(chunk: Buffer): { out: Buffer; found: string[] } {
    const buf = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]);
    const out: Buffer[] = [];
    const found: string[] = [];
    let i = 0;
    for (;;) {
      let best: { at: number; needle: Needle } | undefined;
      for (const needle of this.needles) {
        const at = buf.indexOf(needle.bytes, i);
        if (at < 0) continue;
        if (!best || at < best.at || (at === best.at && needle.bytes.length > best.needle.bytes.length))
          best = { at, needle };
      }
      if (!best) break;
      out.push(buf.subarray(i, best.at), best.needle.replacement);
      found.push(best.needle.id);
      i = best.at + best.needle.bytes.length;
    }
    // A needle that begins in the last `hold` bytes may end in the next chunk.
    const safe = Math.max(i, buf.length - this.hold);
    out.push(buf.subarray(i, safe));
    this.pending = Buffer.from(buf.subarray(safe));
    return { out: Buffer.concat(out), found };
  }

  /** What was held back; no needle ends in it (it would have been found). */
  end(): Buffer {
    const rest = this.pending;
    this.pending = Buffer.alloc(0);
    return rest;
  }
}

/** A transform that replaces the needles as the bytes pass; `onFound` hears each one found. */
export function scrubStream(needles: Needle[], onFound?: (id: string) => void): Transform {
  const matcher = new StreamMatcher(needles);
  return new Transform({
    transform(chunk: Buffer, _enc, done: TransformCallback) {
      const { out, found } = matcher.push(chunk);
      for (const id of found) onFound?.(id);
      done(null, out.length > 0 ? out : undefined);
    },
    flush(done: TransformCallback) {
      const rest = matcher.end();
      done(null, rest.length > 0 ? rest : undefined);
    },
  });
}

/**
 * The forms in which a value may come back in a response: as it is, base64 (standard, without
 * padding, URL-safe) and URL-encoded (path and form style). Each is replaced by `replacement`.
 */
export function echoNeedles(id: string, value: string, replacement: string): Needle[] {
  const raw = Buffer.from(value, "utf8");
  const b64 = raw.toString("base64");
  const forms = new Set([
    value,
    b64,
    b64.replace(/=+$/, ""),
    raw.toString("base64url"),
    encodeURIComponent(value),
    encodeURIComponent(value).replace(/%20/g, "+"),
  ]);
  const rep = Buffer.from(replacement, "utf8");
  return [...forms].filter((f) => f.length > 0).map((f) => ({ bytes: Buffer.from(f, "utf8"), replacement: rep, id }));
}

/** Replaces every form of the values in one string (a response header). */
export function scrubText(text: string, needles: Needle[]): string {
  const matcher = new StreamMatcher(needles);
  const { out } = matcher.push(Buffer.from(text, "utf8"));
  return Buffer.concat([out, matcher.end()]).toString("utf8");
}
