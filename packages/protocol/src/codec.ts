/**
 * Length-prefixed frames over one byte stream (stdio, virtio-serial, vsock).
 *
 *   u32be header_length | u32be payload_length | header (UTF-8 JSON) | payload (raw bytes)
 *
 * Both lengths are bounded so a peer cannot make the other side allocate without limit.
 */
export const FRAME_PREFIX_BYTES = 8;
export const MAX_HEADER_BYTES = 64 * 1024;
export const MAX_PAYLOAD_BYTES = 1024 * 1024;

export interface RawFrame {
  header: unknown;
  payload: Buffer;
}

export class FrameError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

const EMPTY = Buffer.alloc(0);

/**
 * What a host that takes over a running agent's byte stream (after the previous host died, maybe
 * in the middle of a frame) writes before its first frame: enough 0xFF bytes to complete any frame
 * the agent was still reading (0xFF can never start a valid frame: its length would be out of
 * range), then an end marker. The agent, on the framing error this causes, drops everything up to
 * and including the marker, and the new host's frames follow in step.
 */
export const RESYNC_END = Buffer.from("\xffBOTHY-RESYNC-END\x00", "latin1");
export function resyncPreamble(): Buffer {
  return Buffer.concat([Buffer.alloc(FRAME_PREFIX_BYTES + MAX_HEADER_BYTES + MAX_PAYLOAD_BYTES + 1, 0xff), RESYNC_END]);
}

export function encodeFrame(header: object, payload: Buffer | Uint8Array = EMPTY): Buffer {
  const head = Buffer.from(JSON.stringify(header), "utf8");
  if (head.length > MAX_HEADER_BYTES)
    throw new FrameError(`frame header of ${head.length} bytes exceeds ${MAX_HEADER_BYTES}`);
  if (payload.length > MAX_PAYLOAD_BYTES)
    throw new FrameError(`frame payload of ${payload.length} bytes exceeds ${MAX_PAYLOAD_BYTES}`);
  const prefix = Buffer.allocUnsafe(FRAME_PREFIX_BYTES);
  prefix.writeUInt32BE(head.length, 0);
  prefix.writeUInt32BE(payload.length, 4);
  return Buffer.concat([prefix, head, payload]);
}

/**
 * Incremental decoder: feed it chunks as they arrive, get whole frames out. Throws FrameError on
 * an oversized or malformed frame; after that the stream is unusable and must be closed.
 */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private buffered = 0;

  push(chunk: Buffer): RawFrame[] {
    this.append(chunk);
    return this.decode();
  }

  /** Buffers bytes without decoding them (see `seek`). */
  append(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.buffered += chunk.length;
  }

  /**
   * For a reader that joins a stream mid-frame (a host re-attaching to a running agent): drops
   * buffered bytes up to the next frame whose header starts with `marker` and whose lengths `fits`
   * accepts, and answers whether one was found. What came before is dropped, never misread.
   */
  seek(marker: Buffer, fits: (headerLength: number, payloadLength: number) => boolean): boolean {
    const all = Buffer.concat(this.chunks);
    for (let from = FRAME_PREFIX_BYTES; ;) {
      const at = all.indexOf(marker, from);
      if (at < 0) {
        // Keep only what could still be the start of a marked frame.
        this.keepOnly(all.subarray(Math.max(0, all.length - (marker.length + FRAME_PREFIX_BYTES - 1))));
        return false;
      }
      const start = at - FRAME_PREFIX_BYTES;
      if (fits(all.readUInt32BE(start), all.readUInt32BE(start + 4))) {
        this.keepOnly(all.subarray(start));
        return true;
      }
      from = at + 1;
    }
  }

  /** Drops buffered bytes up to and including the first `marker`; answers whether it was there. */
  skipPast(marker: Buffer): boolean {
    const all = Buffer.concat(this.chunks);
    const at = all.indexOf(marker);
    this.keepOnly(
      at < 0 ? all.subarray(Math.max(0, all.length - marker.length + 1)) : all.subarray(at + marker.length),
    );
    return at >= 0;
  }

  private keepOnly(rest: Buffer): void {
    this.chunks = rest.length > 0 ? [rest] : [];
    this.buffered = rest.length;
  }

  /** Takes every whole frame buffered so far. */
  decode(): RawFrame[] {
    const frames: RawFrame[] = [];
    for (;;) {
      if (this.buffered < FRAME_PREFIX_BYTES) break;
      const prefix = this.peek(FRAME_PREFIX_BYTES);
      const headLen = prefix.readUInt32BE(0);
      const payloadLen = prefix.readUInt32BE(4);
      if (headLen === 0 || headLen > MAX_HEADER_BYTES)
        throw new FrameError(`frame header length ${headLen} out of range (1..${MAX_HEADER_BYTES})`);
      if (payloadLen > MAX_PAYLOAD_BYTES)
        throw new FrameError(`frame payload length ${payloadLen} exceeds ${MAX_PAYLOAD_BYTES}`);
      const total = FRAME_PREFIX_BYTES + headLen + payloadLen;
      if (this.buffered < total) break;
      const whole = this.take(total);
      let header: unknown;
      try {
        header = JSON.parse(whole.subarray(FRAME_PREFIX_BYTES, FRAME_PREFIX_BYTES + headLen).toString("utf8"));
      } catch {
        throw new FrameError("frame header is not valid JSON");
      }
      frames.push({ header, payload: whole.subarray(FRAME_PREFIX_BYTES + headLen) });
    }
    return frames;
  }

  get bufferedBytes(): number {
    return this.buffered;
  }

  private peek(n: number): Buffer {
    const first = this.chunks[0];
    if (first !== undefined && first.length >= n) return first.subarray(0, n);
    const joined = Buffer.concat(this.chunks);
    this.chunks = [joined];
    return joined.subarray(0, n);
  }

  private take(n: number): Buffer {
    const first = this.chunks[0];
    let out: Buffer;
    if (first !== undefined && first.length >= n) {
      out = first.subarray(0, n);
      if (first.length === n) this.chunks.shift();
      else this.chunks[0] = first.subarray(n);
    } else {
      const joined = Buffer.concat(this.chunks);
      out = joined.subarray(0, n);
      this.chunks = joined.length > n ? [joined.subarray(n)] : [];
    }
    this.buffered -= n;
    return out;
  }
}
