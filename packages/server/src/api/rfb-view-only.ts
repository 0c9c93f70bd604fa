/**
 * View only, enforced by the server: a filter over the client's half of an RFB (VNC) stream that
 * passes the handshake and the messages that ask for pictures, and drops key, pointer, clipboard
 * and screen-resize messages. x11vnc's own -viewonly is for every client at once, so it is done
 * here, per connection. Answers the bytes to pass on, or null for a stream it cannot follow
 * (a security type other than None, a message type it does not know): the relay then closes.
 */

/** Bytes of each client message type, from its first bytes; undefined while more are needed. */
type Sizer = (buf: Buffer) => number | undefined;
const fixed =
  (n: number): Sizer =>
  () =>
    n;
/** A message whose size is `base` plus `per` for each of the count at `offset` (1 or 2 bytes). */
const at = (offset: number, width: 1 | 2, per: number, base: number): Sizer => {
  return (buf) => {
    if (buf.length < offset + width) return undefined;
    return base + (width === 1 ? buf.readUInt8(offset) : buf.readUInt16BE(offset)) * per;
  };
};

/** ClientCutText: a negative length is the extended clipboard's (its size is the absolute value). */
const cutText: Sizer = (buf) => (buf.length < 8 ? undefined : 8 + Math.abs(buf.readInt32BE(4)));

/** RFC 6143 section 7.5 and the extensions noVNC sends: [size, passed on]. */
const MESSAGES = new Map<number, [Sizer, boolean]>([
  [0, [fixed(20), true]], // SetPixelFormat
  [2, [at(2, 2, 4, 4), true]], // SetEncodings
  [3, [fixed(10), true]], // FramebufferUpdateRequest
  [4, [fixed(8), false]], // KeyEvent
  [5, [fixed(6), false]], // PointerEvent
  [6, [cutText, false]], // ClientCutText
  [150, [fixed(10), true]], // EnableContinuousUpdates
  [248, [at(8, 1, 1, 9), true]], // ClientFence
  [251, [at(6, 1, 16, 8), false]], // SetDesktopSize
]);

/** The filter over one client stream; `held` is how many bytes it keeps waiting for the rest of a message. */
export interface ViewOnlyFilter {
  (chunk: Buffer): Buffer | null;
  readonly held: number;
}

/**
 * Messages it passes are kept until whole (the largest, SetEncodings, is under 256 KiB); the ones
 * it drops are skipped as they stream past, once their size is known, so a ClientCutText that
 * announces 2 GiB costs nothing to hold.
 */
export function viewOnlyRfb(): ViewOnlyFilter {
  let pending: Buffer = Buffer.alloc(0);
  /** Bytes still to drop of a message already known to be dropped. */
  let skip = 0;
  // Version (12 bytes), then for 3.7/3.8 the chosen security type, then ClientInit (1 byte).
  let stage: "version" | "security" | "init" | "messages" = "version";
  const filter = (chunk: Buffer): Buffer | null => {
    if (skip > 0) {
      const n = Math.min(skip, chunk.length);
      skip -= n;
      chunk = chunk.subarray(n);
    }
    pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
    const out: Buffer[] = [];
    for (;;) {
      if (stage === "version") {
        if (pending.length < 12) break;
        const version = pending.subarray(0, 12).toString("latin1");
        if (!/^RFB 003\.00[378]\n$/.test(version)) return null;
        stage = version === "RFB 003.003\n" ? "init" : "security";
        out.push(pending.subarray(0, 12));
        pending = pending.subarray(12);
      } else if (stage === "security") {
        if (pending.length < 1) break;
        if (pending[0] !== 1) return null; // only None: x11vnc runs without a password inside
        out.push(pending.subarray(0, 1));
        pending = pending.subarray(1);
        stage = "init";
      } else if (stage === "init") {
        if (pending.length < 1) break;
        out.push(pending.subarray(0, 1));
        pending = pending.subarray(1);
        stage = "messages";
      } else {
        if (pending.length < 1) break;
        const kind = MESSAGES.get(pending[0] ?? -1);
        if (!kind) return null;
        const size = kind[0](pending);
        if (size === undefined) break;
        if (!kind[1]) {
          // Dropped: whatever of it is here goes now, the rest as it arrives.
          const n = Math.min(size, pending.length);
          skip = size - n;
          pending = pending.subarray(n);
          continue;
        }
        if (pending.length < size) break;
        out.push(pending.subarray(0, size));
        pending = pending.subarray(size);
      }
    }
    // What waits is copied out of the chunk, so a small remainder does not keep a large chunk alive.
    if (pending.length > 0) pending = Buffer.from(pending);
    return Buffer.concat(out);
  };
  return Object.defineProperty(filter, "held", { get: () => pending.length }) as ViewOnlyFilter;
}
