/**
 * Files in the guest over the agent channel: stat, list, mkdir, remove, rename, and the streamed
 * read and write, each within the guest's credit window so neither side buffers a whole file.
 */
import type { Readable } from "node:stream";
import {
  BothyError,
  dirEntries,
  MAX_PAYLOAD_BYTES,
  UPLOAD_WINDOW_BYTES,
  type DirEntry,
  type FileStat,
  type HostFrame,
} from "@bothy/protocol";
import type { AgentChannel } from "./agent-channel.ts";
import { ReadSink } from "./read-sink.ts";

export class FileClient {
  constructor(private readonly channel: AgentChannel) {}

  stat(path: string, options: { sha256?: boolean } = {}): Promise<FileStat> {
    return this.channel.request(
      `stat ${path}`,
      (id) => ({ t: "stat", id, path, sha256: options.sha256 }),
      "stat_result",
      (frame) => frame.stat,
    );
  }

  list(path: string): Promise<{ entries: DirEntry[]; truncated: boolean }> {
    return new Promise((resolve, reject) => {
      const id = this.channel.allocate({
        frame: (frame, payload) => {
          if (frame.t !== "list_result") return false;
          this.channel.settle(id);
          const entries = parseEntries(payload);
          if (entries) resolve({ entries, truncated: frame.truncated });
          else
            this.channel.lose(
              new BothyError("agent_protocol_error", "The guest agent sent an invalid directory listing."),
            );
          return true;
        },
        fail: reject,
      });
      this.channel.send({ t: "list", id, path });
      this.channel.arm(id, `list ${path}`);
    });
  }

  mkdir(path: string, parents = false): Promise<void> {
    return this.simple(`mkdir ${path}`, (id) => ({ t: "mkdir", id, path, parents }));
  }

  remove(path: string, recursive = false): Promise<void> {
    return this.simple(`remove ${path}`, (id) => ({ t: "remove", id, path, recursive }));
  }

  rename(from: string, to: string): Promise<void> {
    return this.simple(`rename ${from}`, (id) => ({ t: "rename", id, from, to }));
  }

  private simple(what: string, frame: (id: number) => HostFrame): Promise<void> {
    return this.channel.request(what, frame, "done", () => undefined);
  }

  /**
   * Opens a file in the guest (following symlinks) and streams it out. Resolves once the guest
   * has opened it, with the stat of the file it opened: the stream is exactly `stat.size` long.
   * The guest sends at most a credit window ahead of what the stream's reader has taken, so a
   * slow reader never makes anything buffer the file.
   */
  openRead(path: string): Promise<{ stat: FileStat; stream: Readable }> {
    const channel = this.channel;
    return new Promise((resolve, reject) => {
      let opened = false;
      const sink = new ReadSink(
        (bytes) => channel.send({ t: "credit", id, bytes }),
        (waiting) => (waiting ? channel.arm(id, `read ${path}`) : channel.disarm(id)),
      );
      const id = channel.allocate({
        frame: (frame, payload) => {
          switch (frame.t) {
            case "stat_result":
              channel.disarm(id);
              opened = true;
              sink.expect(frame.stat.size);
              resolve({ stat: frame.stat, stream: sink });
              sink.watch();
              return true;
            case "file_chunk":
              sink.chunk(payload);
              return true;
            case "file_done":
              channel.settle(id);
              sink.end();
              return true;
            default:
              return false;
          }
        },
        fail: (e) => {
          // Before the open nobody reads the stream, so only the promise carries the error.
          if (opened) sink.fail(e);
          else {
            sink.destroy();
            reject(e);
          }
        },
      });
      sink.onCancel(() => {
        channel.settle(id);
        channel.send({ t: "cancel", id });
      });
      channel.send({ t: "file_read", id, path });
      sink.watch();
    });
  }

  async readFile(path: string, limit = 64 * 1024 * 1024): Promise<Buffer> {
    const chunks: Buffer[] = [];
    let size = 0;
    const { stat, stream } = await this.openRead(path);
    if (stat.size > limit) {
      stream.destroy();
      throw new BothyError("file_error", `The file is larger than ${limit} bytes.`);
    }
    for await (const chunk of stream) {
      size += (chunk as Buffer).length;
      if (size > limit) throw new BothyError("file_error", `The file is larger than ${limit} bytes.`);
      chunks.push(chunk as Buffer);
    }
    return Buffer.concat(chunks);
  }

  writeFile(
    path: string,
    data: Buffer,
    options: { mode?: number; ifSha256?: string } = {},
  ): Promise<{ size: number; sha256: string }> {
    return this.writeStream(path, [data], options);
  }

  /**
   * Streams data into a guest file, replaced atomically at the end. At most a window of
   * unacknowledged bytes is in flight, so a 1 GB upload holds about a megabyte in memory.
   */
  async writeStream(
    path: string,
    source: AsyncIterable<Buffer | Uint8Array> | Iterable<Buffer | Uint8Array>,
    options: { mode?: number; ifSha256?: string } = {},
  ): Promise<{ size: number; sha256: string }> {
    const channel = this.channel;
    let inflight = 0;
    let eofSent = false;
    let wake: (() => void) | undefined;
    let failure: BothyError | undefined;
    let resolveDone!: (r: { size: number; sha256: string }) => void;
    let rejectDone!: (e: BothyError) => void;
    const done = new Promise<{ size: number; sha256: string }>((res, rej) => {
      resolveDone = res;
      rejectDone = rej;
    });
    done.catch(() => undefined);
    const id = channel.allocate({
      frame: (frame) => {
        switch (frame.t) {
          case "file_ack":
            inflight -= frame.bytes;
            // After the last chunk the guest owes the commit: each ack restarts its deadline.
            if (eofSent) channel.arm(id, `write ${path}`);
            wake?.();
            return true;
          case "file_done":
            channel.settle(id);
            resolveDone({ size: frame.size, sha256: frame.sha256 });
            return true;
          default:
            return false;
        }
      },
      fail: (e) => {
        failure = e;
        rejectDone(e);
        wake?.();
      },
    });
    channel.send({ t: "file_write", id, path, mode: options.mode, if_sha256: options.ifSha256 });
    try {
      for await (const chunk of source) {
        const buf = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
        for (let off = 0; off < buf.length; off += MAX_PAYLOAD_BYTES) {
          const part = buf.subarray(off, off + MAX_PAYLOAD_BYTES);
          while (inflight + part.length > UPLOAD_WINDOW_BYTES && !failure) {
            channel.arm(id, `write ${path}`);
            await new Promise<void>((r) => (wake = r));
            channel.disarm(id);
          }
          if (failure) throw failure;
          inflight += part.length;
          channel.send({ t: "file_chunk", id, eof: false }, part);
        }
      }
    } catch (err) {
      // Never commit a partial upload: the guest removes its temporary file.
      channel.settle(id);
      channel.send({ t: "cancel", id });
      throw err instanceof BothyError
        ? err
        : new BothyError("file_error", `Upload aborted: ${(err as Error).message}`, { cause: err });
    }
    channel.send({ t: "file_chunk", id, eof: true });
    eofSent = true;
    channel.arm(id, `write ${path}`);
    return done;
  }
}

function parseEntries(payload: Buffer): DirEntry[] | undefined {
  try {
    const parsed = dirEntries.safeParse(JSON.parse(payload.toString("utf8")));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}
