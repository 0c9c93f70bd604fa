import type { Readable, Writable } from "node:stream";
import { encodeFrame, FrameDecoder, RESYNC_END, type RawFrame } from "@bothy/protocol";

/**
 * The agent's end of the one byte stream to the host. Decodes frames, encodes frames, and tells
 * its users when the stream is congested so they can stop producing.
 */
export class Channel {
  private decoder = new FrameDecoder();
  private congested = false;
  /** After a framing error: bytes are dropped until the resync end marker (see `resyncPreamble`). */
  private hunting = false;
  private readonly drainWaiters = new Set<() => void>();

  constructor(
    private readonly input: Readable,
    private readonly output: Writable,
    private readonly onFrame: (frame: RawFrame) => void,
    private readonly onClose: (reason: string) => void,
  ) {
    input.on("data", (chunk: Buffer) => {
      this.decoder.append(chunk);
      for (;;) {
        if (this.hunting) {
          if (!this.decoder.skipPast(RESYNC_END)) return;
          this.hunting = false;
        }
        let frames: RawFrame[];
        try {
          frames = this.decoder.decode();
        } catch {
          // Out of step: a host that died mid-frame, and a new one that sent its resync preamble.
          // Nothing is trusted until the end marker; a stream that never sends one stays silent.
          this.hunting = true;
          continue;
        }
        for (const frame of frames) this.onFrame(frame);
        return;
      }
    });
    input.on("end", () => this.onClose("host closed the channel"));
    input.on("error", (err) => this.onClose(`channel read error: ${err.message}`));
    output.on("error", (err) => this.onClose(`channel write error: ${err.message}`));
    output.on("drain", () => {
      this.congested = false;
      for (const waiter of [...this.drainWaiters]) waiter();
    });
  }

  /** Drops a partly received frame: the peer that was sending it is gone. */
  resetDecoder(): void {
    this.decoder = new FrameDecoder();
  }

  send(header: object, payload?: Buffer): void {
    if (!this.output.write(encodeFrame(header, payload))) this.congested = true;
  }

  get isCongested(): boolean {
    return this.congested;
  }

  /** Calls `fn` each time the stream drains, until the returned function is called. */
  onDrain(fn: () => void): () => void {
    this.drainWaiters.add(fn);
    return () => this.drainWaiters.delete(fn);
  }
}
