import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { lstat, open, readFile, rename, rm, type FileHandle } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { OUTPUT_CHUNK_BYTES, type FileStat, type ParsedHostFrame } from "@bothy/protocol";
import type { Channel } from "./channel.ts";
import { kernelRandomBytes } from "./identity.ts";

type GuestErrorCode = "not_found" | "io_error" | "precondition_failed";

export class FileOpError extends Error {
  constructor(
    readonly code: GuestErrorCode,
    message: string,
  ) {
    super(message);
  }
}

export function fileOpError(err: unknown): FileOpError {
  if (err instanceof FileOpError) return err;
  const e = err as NodeJS.ErrnoException;
  if (e.code === "ENOENT") return new FileOpError("not_found", e.message);
  return new FileOpError("io_error", e.message ?? String(err));
}

export async function statPath(path: string): Promise<FileStat> {
  const st = await lstat(path);
  const type = st.isFile() ? "file" : st.isDirectory() ? "dir" : st.isSymbolicLink() ? "symlink" : "other";
  return { type, size: st.size, mode: st.mode & 0o7777, mtime_ms: st.mtimeMs };
}

/** Streams a file to the host as file_chunk frames, pausing while the channel is congested. */
export async function readToChannel(id: number, path: string, channel: Channel): Promise<void> {
  const hash = createHash("sha256");
  let size = 0;
  const stream = createReadStream(path, { highWaterMark: OUTPUT_CHUNK_BYTES });
  const stopDrain = channel.onDrain(() => stream.resume());
  try {
    await new Promise<void>((resolve, reject) => {
      stream.on("data", (chunk) => {
        const buf = chunk as Buffer;
        hash.update(buf);
        size += buf.length;
        channel.send({ t: "file_chunk", id }, buf);
        if (channel.isCongested) stream.pause();
      });
      stream.on("end", resolve);
      stream.on("error", reject);
    });
  } finally {
    stopDrain();
  }
  channel.send({ t: "file_done", id, size, sha256: hash.digest("hex") });
}

type WriteFrame = Extract<ParsedHostFrame, { t: "file_write" }>;

/**
 * An atomic write: data goes to a temporary file beside the target, which replaces the target by
 * rename only after fsync, so a reader sees the old file or the new one, never a mix.
 */
export class AtomicWrite {
  private readonly tmpPath: string;
  private handle: Promise<FileHandle>;
  private readonly hash = createHash("sha256");
  private size = 0;
  private chain: Promise<unknown> = Promise.resolve();

  constructor(private readonly frame: WriteFrame) {
    this.tmpPath = join(dirname(frame.path), `.${basename(frame.path)}.bothy-${kernelRandomBytes(6).toString("hex")}`);
    this.handle = open(this.tmpPath, "wx", frame.mode ?? 0o644);
    this.handle.catch(() => undefined);
  }

  /** Appends a chunk; chunks are written strictly in order. */
  write(data: Buffer): Promise<void> {
    const copy = Buffer.from(data);
    const step = this.chain.then(async () => {
      const fh = await this.handle;
      await fh.write(copy);
      this.hash.update(copy);
      this.size += copy.length;
    });
    this.chain = step.catch(() => undefined);
    return step;
  }

  async commit(): Promise<{ size: number; sha256: string }> {
    await this.chain;
    const fh = await this.handle;
    try {
      await fh.sync();
      if (this.frame.mode !== undefined) await fh.chmod(this.frame.mode);
    } finally {
      await fh.close();
    }
    if (this.frame.if_sha256 !== undefined) {
      const current = await readFile(this.frame.path).catch(() => undefined);
      const currentHash = current === undefined ? "" : createHash("sha256").update(current).digest("hex");
      if (currentHash !== this.frame.if_sha256) {
        throw new FileOpError("precondition_failed", `${this.frame.path} changed since it was read (sha256 ${currentHash || "absent"})`);
      }
    }
    await rename(this.tmpPath, this.frame.path);
    return { size: this.size, sha256: this.hash.digest("hex") };
  }

  async abort(): Promise<void> {
    await this.handle.then((fh) => fh.close()).catch(() => undefined);
    await rm(this.tmpPath, { force: true });
  }
}
