import { Readable } from "node:stream";
import { BothyError } from "@bothy/protocol";

/**
 * The readable end of a file coming out of the guest. Each chunk is credited back to the guest
 * only once the reader has room for more, so the guest's credit window is the only buffer.
 */
export class ReadSink extends Readable {
  private owed = 0;
  private ended = false;
  /** Bytes still to come, once the guest has said how long the opened file is. */
  private remaining: number | undefined;
  private cancelListener: (() => void) | undefined;

  /**
   * `waiting(true)` whenever the guest owes this stream something (its answer to the open, or
   * more bytes while it has credit: every chunk taken has been credited back), `waiting(false)`
   * while only the reader holds it up; the client's deadline runs only in the first case.
   */
  constructor(
    private readonly credit: (bytes: number) => void,
    private readonly waiting: (yes: boolean) => void,
  ) {
    super({ highWaterMark: 256 * 1024 });
  }

  /**
   * The opened file's size: the stream is exactly that long. It ends as soon as that many bytes
   * have come (an HTTP response with that Content-Length is then complete, whatever the guest does
   * next) and drops anything beyond; it fails if the guest ends with fewer (the file shrank).
   */
  expect(length: number): void {
    this.remaining = length;
    if (length === 0) this.finish();
  }

  chunk(data: Buffer): void {
    if (this.destroyed || this.ended) return;
    const part = this.remaining === undefined ? data : data.subarray(0, this.remaining);
    if (this.remaining !== undefined) this.remaining -= part.length;
    if (this.push(Buffer.from(part))) this.credit(data.length);
    else this.owed += data.length;
    if (this.remaining === 0) this.finish();
    else this.watch();
  }

  /** The guest has sent everything. */
  end(): void {
    if (this.ended || this.destroyed) return;
    if (this.remaining !== undefined && this.remaining > 0) {
      this.fail(
        new BothyError("file_error", `The file shrank while it was read: ${this.remaining} bytes short of its size.`),
      );
      return;
    }
    this.ended = true;
    this.watch();
    this.push(null);
  }

  fail(err: BothyError): void {
    this.destroy(err);
  }

  /** Called once if the reader gives up before the end. */
  onCancel(fn: () => void): void {
    this.cancelListener = fn;
  }

  /** Tells the client whether the guest owes this stream something now. */
  watch(): void {
    this.waiting(!this.ended && !this.destroyed && this.owed === 0);
  }

  override _read(): void {
    if (this.owed === 0) return;
    const owed = this.owed;
    this.owed = 0;
    this.credit(owed);
    this.watch();
  }

  override _destroy(err: Error | null, callback: (error?: Error | null) => void): void {
    this.waiting(false);
    if (!this.ended) this.cancelListener?.();
    callback(err);
  }

  /** All the bytes are here: the guest need not send the rest, nor its `file_done`. */
  private finish(): void {
    this.ended = true;
    this.waiting(false);
    this.push(null);
    this.cancelListener?.();
  }
}
