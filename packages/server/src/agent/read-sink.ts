import { Readable } from "node:stream";
import type { BothyError } from "@bothy/protocol";

/**
 * The readable end of a file coming out of the guest. Each chunk is credited back to the guest
 * only once the reader has room for more, so the guest's credit window is the only buffer.
 */
export class ReadSink extends Readable {
  private owed = 0;
  private ended = false;
  private cancelListener: (() => void) | undefined;

  /**
   * With `length`, the stream is exactly that long: it ends as soon as that many bytes have come
   * (an HTTP response with that Content-Length is then complete, whatever the guest does next)
   * and drops anything beyond, as for a file that grew after its stat.
   */
  constructor(
    private readonly credit: (bytes: number) => void,
    private remaining?: number,
  ) {
    super({ highWaterMark: 256 * 1024 });
  }

  chunk(data: Buffer): void {
    if (this.destroyed || this.ended) return;
    const part = this.remaining === undefined ? data : data.subarray(0, this.remaining);
    if (this.remaining !== undefined) this.remaining -= part.length;
    if (this.push(Buffer.from(part))) this.credit(data.length);
    else this.owed += data.length;
    if (this.remaining === 0) {
      this.end();
      this.cancelListener?.(); // the guest need not send the rest
    }
  }

  end(): void {
    if (this.ended) return;
    this.ended = true;
    this.push(null);
  }

  fail(err: BothyError): void {
    this.destroy(err);
  }

  /** Called once if the reader gives up before the end. */
  onCancel(fn: () => void): void {
    this.cancelListener = fn;
  }

  override _read(): void {
    if (this.owed === 0) return;
    const owed = this.owed;
    this.owed = 0;
    this.credit(owed);
  }

  override _destroy(err: Error | null, callback: (error?: Error | null) => void): void {
    if (!this.ended) this.cancelListener?.();
    callback(err);
  }
}
