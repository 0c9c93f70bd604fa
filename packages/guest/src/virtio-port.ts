import { close, openSync, read, write } from "node:fs";
import { Readable, Writable } from "node:stream";

/** How long to wait before reading again while no host is connected. */
const NO_HOST_RETRY_MS = 50;
const READ_BYTES = 64 * 1024;

/**
 * The agent's channel over a virtio-serial port (`/dev/vportNpM`) for the QEMU driver. libuv
 * treats the char device as a file, so this reads and writes with fs.read/fs.write on the thread
 * pool: one read and at most one write in flight, so a blocked port never takes more threads.
 *
 * A read that returns 0 means no host is connected (not EOF): before the host connects, while a
 * VM is paused, and right after a snapshot is restored. `onHostGone` fires when a connected host
 * goes away, so the agent can say hello again to whoever connects next.
 */
export class VirtioPort {
  readonly input: Readable;
  readonly output: Writable;
  private readonly fd: number;
  private hostSeen = false;
  private reading = false;
  private closed = false;

  constructor(
    path: string,
    private readonly onHostGone: () => void,
  ) {
    this.fd = openSync(path, "r+");
    this.input = new Readable({ read: () => this.pump() });
    this.output = new Writable({
      highWaterMark: 1024 * 1024,
      write: (chunk: Buffer, _enc, done) => this.writeAll(chunk, 0, done),
      // Frames queued behind a write in flight go out together: in an emulated VM each write to
      // the port costs milliseconds, however little it carries.
      writev: (chunks, done) => this.writeAll(Buffer.concat(chunks.map((c) => c.chunk as Buffer)), 0, done),
    });
  }

  private pump(): void {
    if (this.reading || this.closed) return;
    this.reading = true;
    const buf = Buffer.allocUnsafe(READ_BYTES);
    read(this.fd, buf, 0, READ_BYTES, null, (err, n) => {
      this.reading = false;
      if (err) {
        this.input.destroy(err);
        return;
      }
      if (n === 0) {
        if (this.hostSeen) {
          this.hostSeen = false;
          this.onHostGone();
        }
        setTimeout(() => this.pump(), NO_HOST_RETRY_MS);
        return;
      }
      this.hostSeen = true;
      // push() returning false means the consumer is full: read() calls pump again when not.
      if (this.input.push(buf.subarray(0, n))) this.pump();
    });
  }

  private writeAll(chunk: Buffer, off: number, done: (err?: Error | null) => void): void {
    write(this.fd, chunk, off, chunk.length - off, null, (err, n) => {
      if (err) return done(err);
      if (off + n < chunk.length) return this.writeAll(chunk, off + n, done);
      done();
    });
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    close(this.fd, () => undefined);
  }
}
