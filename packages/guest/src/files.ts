import { createHash } from "node:crypto";
import { createReadStream, type ReadStream, type Stats } from "node:fs";
import { lstat, mkdir, open, opendir, realpath, rename, rm, rmdir, type FileHandle } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import {
  MAX_LIST_ENTRIES,
  OUTPUT_CHUNK_BYTES,
  OUTPUT_WINDOW_BYTES,
  type DirEntry,
  type FileStat,
  type ParsedHostFrame,
} from "@bothy/protocol";
import type { Channel } from "./channel.ts";
import { kernelRandomBytes } from "./identity.ts";

type GuestErrorCode = "not_found" | "exists" | "io_error" | "precondition_failed";

/** Relative paths are relative to the workspace; everything resolves inside this sandbox. */
export function resolveGuestPath(path: string): string {
  return resolve("/workspace", path);
}

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
  if (e.code === "EEXIST") return new FileOpError("exists", e.message);
  return new FileOpError("io_error", e.message ?? String(err));
}

function fileType(st: Stats): FileStat["type"] {
  return st.isFile() ? "file" : st.isDirectory() ? "dir" : st.isSymbolicLink() ? "symlink" : "other";
}

export async function statPath(path: string, withHash = false): Promise<FileStat> {
  const st = await lstat(path);
  const stat: FileStat = { type: fileType(st), size: st.size, mode: st.mode & 0o7777, mtime_ms: st.mtimeMs };
  if (withHash && stat.type === "file") stat.sha256 = await hashFile(path);
  return stat;
}

async function hashFile(path: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path, { highWaterMark: OUTPUT_CHUNK_BYTES })) hash.update(chunk as Buffer);
  return hash.digest("hex");
}

export async function listDir(path: string): Promise<{ entries: DirEntry[]; truncated: boolean }> {
  const dir = await opendir(path);
  const entries: DirEntry[] = [];
  let truncated = false;
  for await (const dirent of dir) {
    if (entries.length >= MAX_LIST_ENTRIES) {
      truncated = true;
      break;
    }
    const st = await lstat(join(path, dirent.name)).catch(() => undefined);
    if (!st) continue; // removed while we listed
    entries.push({
      name: dirent.name,
      type: fileType(st),
      size: st.size,
      mode: st.mode & 0o7777,
      mtime_ms: st.mtimeMs,
    });
  }
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  return { entries, truncated };
}

export async function makeDir(path: string, parents: boolean): Promise<void> {
  await mkdir(path, { recursive: parents });
}

export async function removePath(path: string, recursive: boolean): Promise<void> {
  const st = await lstat(path);
  if (st.isDirectory() && !recursive) await rmdir(path);
  else await rm(path, { recursive, force: false });
}

export async function renamePath(from: string, to: string): Promise<void> {
  await rename(from, to);
}

/**
 * Streams a file to the host as file_chunk frames under the same credit window as command
 * output, so a slow HTTP client slows the read instead of filling memory on either side.
 */
export class FileRead {
  private inflight = 0;
  private readonly stream: ReadStream;
  private readonly stopDrain: () => void;

  constructor(
    private readonly id: number,
    path: string,
    private readonly channel: Channel,
    onEnd: (err?: unknown) => void,
  ) {
    const hash = createHash("sha256");
    let size = 0;
    this.stream = createReadStream(path, { highWaterMark: OUTPUT_CHUNK_BYTES });
    this.stopDrain = channel.onDrain(() => this.flow());
    this.stream.on("data", (chunk) => {
      const buf = chunk as Buffer;
      hash.update(buf);
      size += buf.length;
      this.inflight += buf.length;
      channel.send({ t: "file_chunk", id }, buf);
      this.flow();
    });
    this.stream.on("end", () => {
      this.stopDrain();
      channel.send({ t: "file_done", id, size, sha256: hash.digest("hex") });
      onEnd();
    });
    this.stream.on("error", (err) => {
      this.stopDrain();
      onEnd(err);
    });
  }

  credit(bytes: number): void {
    this.inflight = Math.max(0, this.inflight - bytes);
    this.flow();
  }

  cancel(): void {
    this.stopDrain();
    this.stream.destroy();
  }

  private flow(): void {
    if (this.inflight >= OUTPUT_WINDOW_BYTES || this.channel.isCongested) this.stream.pause();
    else this.stream.resume();
  }
}

type WriteFrame = Extract<ParsedHostFrame, { t: "file_write" }>;

/**
 * An atomic write: data goes to a temporary file beside the target, which replaces the target by
 * rename only after fsync, so a reader sees the old file or the new one, never a mix.
 */
export class AtomicWrite {
  private tmpPath: string | undefined;
  private target: string;
  private handle: Promise<FileHandle>;
  private readonly hash = createHash("sha256");
  private size = 0;
  private chain: Promise<unknown> = Promise.resolve();

  constructor(private readonly frame: WriteFrame) {
    this.target = frame.path;
    // Work in the directory's real path: the temporary file and the rename must be in the same
    // directory, and gVisor refuses an exclusive create through a symlinked directory (EEXIST).
    this.handle = realpath(dirname(frame.path)).then((dir) => {
      this.target = join(dir, basename(frame.path));
      this.tmpPath = join(dir, `.${basename(frame.path)}.bothy-${kernelRandomBytes(6).toString("hex")}`);
      return open(this.tmpPath, "wx", frame.mode ?? 0o644);
    });
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
      const currentHash = await hashFile(this.target).catch(() => "");
      if (currentHash !== this.frame.if_sha256) {
        throw new FileOpError(
          "precondition_failed",
          `${this.frame.path} changed since it was read (sha256 ${currentHash || "absent"})`,
        );
      }
    }
    if (this.tmpPath === undefined) throw new FileOpError("io_error", "internal: no temporary file");
    await rename(this.tmpPath, this.target);
    return { size: this.size, sha256: this.hash.digest("hex") };
  }

  async abort(): Promise<void> {
    await this.handle.then((fh) => fh.close()).catch(() => undefined);
    // Best effort: the temporary file may never have been created.
    if (this.tmpPath !== undefined) await rm(this.tmpPath, { force: true }).catch(() => undefined);
  }
}
