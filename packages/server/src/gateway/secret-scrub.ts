/**
 * Finding secrets and placeholders in streams that arrive in pieces: a match split over two
 * chunks is still found, because the bytes a needle may still begin in are held back until the
 * next chunk or the end shows whether they do.
 */
import { Transform, type TransformCallback } from "node:stream";

export interface Needle {
  bytes: Buffer;
  /** What replaces it in the output. */
  replacement: Buffer;
  /** Reported when it is found (a secret's name). */
  id: string;
  /**
   * Bytes that may carry part of the value around a match: one such byte right before (`before`)
   * and right after (`after`) the match is replaced with it (base64 characters that mix the
   * value's bits with its neighbours').
   */
  edge?: Edge;
}

export interface Edge {
  before: boolean;
  after: boolean;
  test: (byte: number) => boolean;
}

/** Replaces every needle in a stream of chunks, leftmost first (the longest where two start together). */
export class StreamMatcher {
  private pending = Buffer.alloc(0);
  /** Bytes kept back after a push: a needle may begin in them (and an edged one needs the byte before it). */
  private readonly keep: number;

  constructor(private readonly needles: Needle[]) {
    this.keep = Math.max(0, ...needles.map((n) => n.bytes.length - 1 + (n.edge?.before ? 1 : 0)));
  }

  /** The output so far and the ids of the needles found in this chunk. */
  push(chunk: Buffer): { out: Buffer; found: string[] } {
    return this.scan(this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]), false);
  }

  /** What was held back, scrubbed, and the needles found in it (only edged ones can end there). */
  finish(): { out: Buffer; found: string[] } {
    return this.scan(this.pending, true);
  }

  /** What was held back, scrubbed. */
  end(): Buffer {
    return this.finish().out;
  }

  private scan(buf: Buffer, final: boolean): { out: Buffer; found: string[] } {
    const out: Buffer[] = [];
    const found: string[] = [];
    let i = 0;
    let deferred: number | undefined;
    for (;;) {
      let best: { at: number; needle: Needle } | undefined;
      for (const needle of this.needles) {
        const at = buf.indexOf(needle.bytes, i);
        if (at < 0) continue;
        if (!best || at < best.at || (at === best.at && needle.bytes.length > best.needle.bytes.length))
          best = { at, needle };
      }
      if (!best) break;
      const { at, needle } = best;
      let from = at;
      let to = at + needle.bytes.length;
      const edge = needle.edge;
      if (edge) {
        // The byte after it is not here yet: the match is taken again with the next chunk.
        if (edge.after && !final && to >= buf.length) {
          deferred = at;
          break;
        }
        if (edge.before && from > i && edge.test(buf[from - 1]!)) from--;
        if (edge.after && to < buf.length && edge.test(buf[to]!)) to++;
      }
      out.push(buf.subarray(i, from), needle.replacement);
      found.push(needle.id);
      i = to;
    }
    if (final) {
      out.push(buf.subarray(i));
      this.pending = Buffer.alloc(0);
      return { out: Buffer.concat(out), found };
    }
    let safe = Math.max(i, buf.length - this.keep);
    if (deferred !== undefined) safe = Math.max(i, Math.min(safe, deferred - 1));
    out.push(buf.subarray(i, safe));
    this.pending = Buffer.from(buf.subarray(safe));
    return { out: Buffer.concat(out), found };
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
      const { out, found } = matcher.finish();
      for (const id of found) onFound?.(id);
      done(null, out.length > 0 ? out : undefined);
    },
  });
}

/** Characters of either base64 alphabet (padding carries no bits). */
const BASE64_BYTES = new Set(Buffer.from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_"));
const isBase64Byte = (b: number): boolean => BASE64_BYTES.has(b);

/** Shorter runs of base64 would be replaced where they occur by chance. */
const MIN_BASE64_NEEDLE = 4;

/**
 * The base64 characters that depend on the value's bytes alone, for each of the three places it
 * can start within a 3-byte group: they appear in the base64 of any text holding the value (the
 * value alone, `Bearer <value>`, the `user:<value>` of Basic credentials, a JSON document), padded
 * or not, in both alphabets. Where the value does not start or end on a character's boundary, the
 * character there mixes the value's bits with a neighbour's: `edge` says so.
 */
export function base64Forms(raw: Buffer): Array<{ text: string; before: boolean; after: boolean }> {
  const forms: Array<{ text: string; before: boolean; after: boolean }> = [];
  for (const offset of [0, 1, 2]) {
    const text = Buffer.concat([Buffer.alloc(offset), raw]).toString("base64");
    const startBit = 8 * offset;
    const endBit = 8 * (offset + raw.length);
    const inner = text.slice(Math.ceil(startBit / 6), Math.floor(endBit / 6));
    if (inner.length < MIN_BASE64_NEEDLE) continue;
    const edges = { before: startBit % 6 !== 0, after: endBit % 6 !== 0 };
    forms.push({ text: inner, ...edges }, { text: inner.replace(/\+/g, "-").replace(/\//g, "_"), ...edges });
  }
  return forms;
}

/**
 * The forms in which a value may come back in a response: as it is; inside any base64 text
 * (standard or URL-safe alphabet, any alignment, padded or not); URL-encoded (path and form
 * style, upper- or lower-case hex); and as a JSON string's content (`/` escaped or not). Each is
 * replaced by `replacement`.
 */
export function echoNeedles(id: string, value: string, replacement: string): Needle[] {
  const raw = Buffer.from(value, "utf8");
  const b64 = raw.toString("base64");
  const url = encodeURIComponent(value);
  const json = JSON.stringify(value).slice(1, -1);
  const plain = new Set(
    [
      value,
      // The value's own base64 whole (padding included), preferred where it starts like a shorter form.
      b64,
      b64.replace(/=+$/, ""),
      raw.toString("base64url"),
      url,
      url.replace(/%20/g, "+"),
      url.replace(/%[0-9A-F]{2}/g, (h) => h.toLowerCase()),
      url.replace(/%[0-9A-F]{2}/g, (h) => h.toLowerCase()).replace(/%20/g, "+"),
      json,
      json.replace(/\//g, "\\/"),
    ].filter((f) => f.length > 0),
  );
  const rep = Buffer.from(replacement, "utf8");
  const needles: Needle[] = [...plain].map((f) => ({ bytes: Buffer.from(f, "utf8"), replacement: rep, id }));
  const seen = new Set(plain);
  for (const f of base64Forms(raw)) {
    if (seen.has(f.text)) continue;
    seen.add(f.text);
    const edge = f.before || f.after ? { before: f.before, after: f.after, test: isBase64Byte } : undefined;
    needles.push({ bytes: Buffer.from(f.text, "utf8"), replacement: rep, id, ...(edge ? { edge } : {}) });
  }
  return needles;
}

/** Replaces every form of the values in one string (a response header). */
export function scrubText(text: string, needles: Needle[]): string {
  const matcher = new StreamMatcher(needles);
  const { out } = matcher.push(Buffer.from(text, "utf8"));
  return Buffer.concat([out, matcher.end()]).toString("utf8");
}
