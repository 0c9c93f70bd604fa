import { createHash } from "node:crypto";
import { constants, type ReadStream, type Stats } from "node:fs";
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

type GuestErrorCode = "not_found" | "exists" | "io_error" | "precondition_failed" | "not_a_file";

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

/**
 * Opens a regular file for reading, following symlinks, and stats what was opened: the size is
 * the opened file's, whatever the path names. O_NONBLOCK so a FIFO is refused instead of
 * blocking the open until a writer comes.
 */
async function openRegular(path: string): Promise<{ fh: FileHandle; st: Stats }> {
  const fh = await open(path, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    const st = await fh.stat();
    if (!st.isFile()) {
      throw new FileOpError(
        "not_a_file",
        st.isDirectory() ? `${path} is a directory` : `${path} is not a regular file (${fileType(st)})`,
      );
    }
    return { fh, st };
  } catch (err) {
    await fh.close();
    throw err;
  }
}

/** The opened file's first `size` bytes: a file that grows while read does not keep the read going. */
function readOpened(fh: FileHandle, size: number): ReadStream {
  return fh.createReadStream({ start: 0, end: Math.max(0, size - 1), highWaterMark: OUTPUT_CHUNK_BYTES });
}

async function hashFile(path: string): Promise<string> {
  const hash = createHash("sha256");
  const { fh, st } = await openRegular(path);
  if (st.size === 0) {
    await fh.close();
    return hash.digest("hex");
  }
  for await (const chunk of readOpened(fh, st.size)) hash.update(chunk as Buffer);
  return hash.digest("hex");
}

/**
 * `path` with its parent directory's real path. mkdir, rename and remove work in a real directory
 * so that none passes through a symlinked one: gVisor answers such a mkdir oddly (EINVAL through a
 * link to /, and Node's recursive mkdir then reports success for a directory it never made).
 */
async function realParent(path: string): Promise<string> {
  return join(await realpath(dirname(path)), basename(path));
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
  if (!parents) {
    await mkdir(await realParent(path));
    return;
  }
  // One step per component of the path, each on a real directory: it cannot loop, whatever
  // symlinks the path holds (a link's target is resolved by the kernel, which stops at ELOOP).
  let dir = "/";
  for (const name of path.split("/").filter(Boolean)) {
    const next = join(dir, name);
    const st = await lstat(next).catch((err: NodeJS.ErrnoException) => {
      if (err.code === "ENOENT") return undefined;
      throw err;
    });
    if (st?.isDirectory()) {
      dir = next;
      continue;
    }
    if (st !== undefined && !st.isSymbolicLink()) throw new FileOpError("exists", `${next} is not a directory`);
    if (st === undefined) {
      await mkdir(next).catch((err: NodeJS.ErrnoException) => {
        if (err.code !== "EEXIST") throw err; // made meanwhile by someone else: checked below
      });
    }
    dir = await realpath(next);
    if (!(await lstat(dir)).isDirectory()) throw new FileOpError("exists", `${next} is not a directory`);
  }
}

export async function removePath(path: string, recursive: boolean): Promise<void> {
  const real = await realParent(path);
  const st = await lstat(real);
  if (st.isDirectory() && !recursive) await rmdir(real);
  else await rm(real, { recursive, force: false });
}

export async function renamePath(from: string, to: string): Promise<void> {
  await rename(await realParent(from), await realParent(to));
}

/**
 * Streams a file to the host: first the opened file's stat (`stat_result`), then its bytes as
 * file_chunk frames under the same credit window as command output, so a slow HTTP client slows
 * the read instead of filling memory on either side. The bytes stop at the size that stat gave.
 */
export class FileRead {
  private inflight = 0;
  private stream: ReadStream | undefined;
  private cancelled = false;
  private stopDrain: () => void = () => undefined;

  constructor(
    private readonly id: number,
    path: string,
    private readonly channel: Channel,
    private readonly onEnd: (err?: unknown) => void,
  ) {
    openRegular(path).then(
      ({ fh, st }) => this.start(fh, st),
      (err) => onEnd(err),
    );
  }

  private start(fh: FileHandle, st: Stats): void {
    if (this.cancelled) {
      void fh.close();
      return;
    }
    const { id, channel } = this;
    channel.send({
      t: "stat_result",
      id,
      stat: { type: "file", size: st.size, mode: st.mode & 0o7777, mtime_ms: st.mtimeMs },
    });
    const hash = createHash("sha256");
    if (st.size === 0) {
      void fh.close();
      channel.send({ t: "file_done", id, size: 0, sha256: hash.digest("hex") });
      this.onEnd();
      return;
    }
    let size = 0;
    const stream = readOpened(fh, st.size);
    this.stream = stream;
    this.stopDrain = channel.onDrain(() => this.flow());
    stream.on("data", (chunk) => {
      const buf = chunk as Buffer;
      hash.update(buf);
      size += buf.length;
      this.inflight += buf.length;
      channel.send({ t: "file_chunk", id }, buf);
      this.flow();
    });
    stream.on("end", () => {
      this.stopDrain();
      channel.send({ t: "file_done", id, size, sha256: hash.digest("hex") });
      this.onEnd();
    });
    stream.on("error", (err) => {
      this.stopDrain();
      this.onEnd(err);
    });
  }

  credit(bytes: number): void {
    this.inflight = Math.max(0, this.inflight - bytes);
    this.flow();
  }

  cancel(): void {
    this.cancelled = true;
    this.stopDrain();
    this.stream?.destroy();
  }

  private flow(): void {
    if (!this.stream) return;
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
