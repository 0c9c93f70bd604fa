import { Duplex } from "node:stream";
import { BothyError, MAX_PAYLOAD_BYTES, UPLOAD_WINDOW_BYTES } from "@bothy/protocol";

/** What a TcpStream needs from the agent client: frames for its connection id. */
export interface TcpLink {
  /** Sends bytes (and, with `eof`, the half-close) to the guest's socket. */
  data(payload: Buffer, eof: boolean): void;
  /** The reader has taken `bytes`: the guest may send that much more. */
  credit(bytes: number): void;
  /** Resets the guest's socket; nothing more arrives for this connection. */
  cancel(): void;
}

/**
 * The host's end of a TCP connection to a port inside the guest, as a socket-like Duplex (so
 * `http.request({ createConnection })` can run over it). Guest bytes are credited back only once
 * the reader has room; host bytes wait for the guest's acknowledgements beyond a window. Neither
 * direction buffers more than a window, whatever the other end's pace.
 */
export class TcpStream extends Duplex {
  private owed = 0;
  private inflight = 0;
  private blockedWrite: (() => void) | undefined;
  /** The guest's socket is gone: writes are dropped, and destroy need not reset anything. */
  private guestGone = false;

  constructor(private readonly link: TcpLink) {
    super({ allowHalfOpen: true, readableHighWaterMark: 256 * 1024 });
  }

  /** Bytes from the guest; `eof` when the in-sandbox server closed its sending side. */
  received(payload: Buffer, eof: boolean): void {
    if (this.destroyed) return;
    if (payload.length > 0) {
      if (this.push(payload)) this.link.credit(payload.length);
      else this.owed += payload.length;
    }
    if (eof) this.push(null);
  }

  /** The guest wrote `bytes` more of ours to its socket. */
  acked(bytes: number): void {
    this.inflight = Math.max(0, this.inflight - bytes);
    this.release();
  }

  /** The guest's socket closed; with `error` it was reset rather than closed cleanly. */
  guestClosed(error: string | undefined): void {
    this.guestGone = true;
    this.release();
    if (error !== undefined) {
      this.destroy(new BothyError("agent_unavailable", `The connection inside the sandbox ended: ${error}`));
      return;
    }
    this.push(null);
    this.end();
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    if (this.guestGone) return callback();
    for (let off = 0; off < chunk.length; off += MAX_PAYLOAD_BYTES) {
      const part = chunk.subarray(off, off + MAX_PAYLOAD_BYTES);
      this.inflight += part.length;
      this.link.data(part, false);
    }
    if (this.inflight < UPLOAD_WINDOW_BYTES) return callback();
    this.blockedWrite = () => callback();
  }

  override _final(callback: (error?: Error | null) => void): void {
    if (!this.guestGone) this.link.data(Buffer.alloc(0), true);
    callback();
  }

  override _read(): void {
    if (this.owed === 0) return;
    const owed = this.owed;
    this.owed = 0;
    this.link.credit(owed);
  }

  override _destroy(err: Error | null, callback: (error?: Error | null) => void): void {
    if (!this.guestGone) {
      this.guestGone = true;
      this.link.cancel();
    }
    this.blockedWrite = undefined;
    callback(err);
  }

  private release(): void {
    if (!this.blockedWrite || (this.inflight >= UPLOAD_WINDOW_BYTES && !this.guestGone)) return;
    const resume = this.blockedWrite;
    this.blockedWrite = undefined;
    resume();
  }
}
