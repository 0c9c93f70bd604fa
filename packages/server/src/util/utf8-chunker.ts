import { isUtf8 } from "node:buffer";

export interface TextChunk {
  data: string;
  encoding?: "base64";
}

/**
 * Turns a byte stream into JSON-safe chunks: text when the bytes are UTF-8, base64 when not.
 * A character split across two chunks is held back until its remaining bytes arrive, so normal
 * text never turns into base64 because of where a pipe happened to cut it.
 */
export class Utf8Chunker {
  private carry: Buffer = Buffer.alloc(0);

  push(chunk: Buffer): TextChunk | undefined {
    const buf = this.carry.length > 0 ? Buffer.concat([this.carry, chunk]) : chunk;
    const cut = buf.length - incompleteTail(buf);
    const head = buf.subarray(0, cut);
    if (isUtf8(head)) {
      this.carry = Buffer.from(buf.subarray(cut));
      return head.length > 0 ? { data: head.toString("utf8") } : undefined;
    }
    this.carry = Buffer.alloc(0);
    return { data: buf.toString("base64"), encoding: "base64" };
  }

  /** Whatever is held back at the end of the stream. */
  flush(): TextChunk | undefined {
    if (this.carry.length === 0) return undefined;
    const rest = this.carry;
    this.carry = Buffer.alloc(0);
    return { data: rest.toString("base64"), encoding: "base64" };
  }
}

/** Bytes at the end of `buf` that start a UTF-8 sequence not yet complete (0..3). */
function incompleteTail(buf: Buffer): number {
  for (let back = 1; back <= Math.min(3, buf.length); back++) {
    const byte = buf[buf.length - back] ?? 0;
    if ((byte & 0xc0) === 0x80) continue; // continuation byte: keep looking for the lead byte
    const need = byte >= 0xf0 ? 4 : byte >= 0xe0 ? 3 : byte >= 0xc0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}
