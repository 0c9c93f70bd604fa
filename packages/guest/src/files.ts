import { createHash, type Hash } from "node:crypto";
import {
  closeSync,
  constants,
  fchmodSync,
  fstatSync,
  fsyncSync,
  lstatSync,
  mkdirSync,
  openSync,
  opendirSync,
  readdirSync,
  readSync,
  realpathSync,
  renameSync,
  rmdirSync,
  unlinkSync,
  writeSync,
  type Stats,
} from "node:fs";
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

/*
 * File requests are served with synchronous calls, never through libuv's thread pool: under
 * gVisor's ptrace platform the pool's four threads are dear to start, and each request handed to
 * them pays two hand-offs between threads (a 1 KB write or read from the API ~30 % slower, the
 * networked create's trust step ~30 ms; docs/architecture.md, sixth pass). What could
 * block the event loop for long goes step by step, one bounded step per turn of the loop: reads
 * and hashes one chunk at a time, a listing or a recursive remove a batch of entries at a time.
 */

/** Lets the event loop turn once: other requests' frames, commands' output. */
function nextTurn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/** How much a hash reads per turn of the event loop. */
const HASH_CHUNK_BYTES = 1024 * 1024;
/** How many entries a listing stats per turn of the event loop. */
const LIST_BATCH = 256;
/** How many entries a recursive remove removes per turn of the event loop. */
const REMOVE_BATCH = 128;

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
  const st = lstatSync(path);
  const stat: FileStat = { type: fileType(st), size: st.size, mode: st.mode & 0o7777, mtime_ms: st.mtimeMs };
  if (withHash && stat.type === "file") stat.sha256 = await hashFile(path);
  return stat;
}

/**
 * Opens a regular file for reading, following symlinks, and stats what was opened: the size is
 * the opened file's, whatever the path names. O_NONBLOCK so a FIFO is refused instead of
 * blocking the open (and with it the whole agent, the call being synchronous) until a writer comes.
 */
function openRegular(path: string): { fd: number; st: Stats } {
  const fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) {
      throw new FileOpError(
        "not_a_file",
        st.isDirectory() ? `${path} is a directory` : `${path} is not a regular file (${fileType(st)})`,
      );
    }
    return { fd, st };
  } catch (err) {
    closeSync(fd);
    throw err;
  }
}

/** Up to `length` bytes at `position`; fewer only at the file's end. */
function readAt(fd: number, buf: Buffer, length: number, position: number): number {
  let got = 0;
  while (got < length) {
    const n = readSync(fd, buf, got, length - got, position + got);
    if (n === 0) break;
    got += n;
  }
  return got;
}

/** The file's first `size` bytes (as stat gave it), one chunk per turn of the event loop. */
async function hashFile(path: string): Promise<string> {
  const hash = createHash("sha256");
  const { fd, st } = openRegular(path);
  try {
    const buf = Buffer.allocUnsafe(Math.min(HASH_CHUNK_BYTES, st.size));
    for (let pos = 0; pos < st.size;) {
      const n = readAt(fd, buf, Math.min(buf.length, st.size - pos), pos);
      if (n === 0) break;
      hash.update(buf.subarray(0, n));
      pos += n;
      if (pos < st.size) await nextTurn();
    }
  } finally {
    closeSync(fd);
  }
  return hash.digest("hex");
}

/**
 * `path` with its parent directory's real path. mkdir, rename and remove work in a real directory
 * so that none passes through a symlinked one: gVisor answers such a mkdir oddly (EINVAL through a
 * link to /, and Node's recursive mkdir then reports success for a directory it never made).
 */
function realParent(path: string): string {
  return join(realpathSync(dirname(path)), basename(path));
}

export async function listDir(path: string): Promise<{ entries: DirEntry[]; truncated: boolean }> {
  const dir = opendirSync(path);
  const entries: DirEntry[] = [];
  let truncated = false;
  try {
    for (let seen = 1; ; seen++) {
      const dirent = dir.readSync();
      if (dirent === null) break;
      if (entries.length >= MAX_LIST_ENTRIES) {
        truncated = true;
        break;
      }
      let st: Stats;
      try {
        st = lstatSync(join(path, dirent.name));
      } catch {
        continue; // removed while we listed
      }
      entries.push({
        name: dirent.name,
        type: fileType(st),
        size: st.size,
        mode: st.mode & 0o7777,
        mtime_ms: st.mtimeMs,
      });
      if (seen % LIST_BATCH === 0) await nextTurn();
    }
  } finally {
    dir.closeSync();
  }
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  return { entries, truncated };
}

function lstatIfExists(path: string): Stats | undefined {
  try {
    return lstatSync(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
}

export async function makeDir(path: string, parents: boolean): Promise<void> {
  if (!parents) {
    mkdirSync(realParent(path));
    return;
  }
  // One step per component of the path, each on a real directory: it cannot loop, whatever
  // symlinks the path holds (a link's target is resolved by the kernel, which stops at ELOOP).
  let dir = "/";
  for (const name of path.split("/").filter(Boolean)) {
    const next = join(dir, name);
    const st = lstatIfExists(next);
    if (st?.isDirectory()) {
      dir = next;
      continue;
    }
    if (st !== undefined && !st.isSymbolicLink()) throw new FileOpError("exists", `${next} is not a directory`);
    if (st === undefined) {
      try {
        mkdirSync(next);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err; // made meanwhile by someone else: checked below
      }
    }
    dir = realpathSync(next);
    if (!lstatSync(dir).isDirectory()) throw new FileOpError("exists", `${next} is not a directory`);
  }
}

export async function removePath(path: string, recursive: boolean): Promise<void> {
  const real = realParent(path);
  const st = lstatSync(real);
  if (!st.isDirectory()) unlinkSync(real);
  else if (!recursive) rmdirSync(real);
  else await removeTree(real, { calls: 0 });
}

/**
 * Removes a directory and all below it, deepest first; a link is removed, never followed. A big
 * tree is many calls: the event loop turns after each REMOVE_BATCH of them, so commands' output
 * and other requests go on meanwhile. What vanishes meanwhile is not an error.
 */
async function removeTree(dir: string, count: { calls: number }): Promise<void> {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    try {
      if (lstatSync(path).isDirectory()) await removeTree(path, count);
      else unlinkSync(path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
    }
    if (++count.calls % REMOVE_BATCH === 0) await nextTurn();
  }
  rmdirSync(dir);
}

export async function renamePath(from: string, to: string): Promise<void> {
  renameSync(realParent(from), realParent(to));
}

/**
 * Streams a file to the host: first the opened file's stat (`stat_result`), then its bytes as
 * file_chunk frames under the same credit window as command output, so a slow HTTP client slows
 * the read instead of filling memory on either side. The bytes stop at the size that stat gave.
 * One chunk is read per turn of the event loop.
 */
export class FileRead {
  private inflight = 0;
  private fd: number | undefined;
  private size = 0;
  private sent = 0;
  private readonly hash: Hash = createHash("sha256");
  private scheduled = false;
  private done = false;
  private stopDrain: () => void = () => undefined;

  constructor(
    private readonly id: number,
    path: string,
    private readonly channel: Channel,
    private readonly onEnd: (err?: unknown) => void,
  ) {
    // Never before the caller has recorded this read: onEnd forgets it.
    queueMicrotask(() => this.start(path));
  }

  private start(path: string): void {
    if (this.done) return;
    let st: Stats;
    try {
      ({ fd: this.fd, st } = openRegular(path));
    } catch (err) {
      this.end(err);
      return;
    }
    const { id, channel } = this;
    this.size = st.size;
    channel.send({
      t: "stat_result",
      id,
      stat: { type: "file", size: st.size, mode: st.mode & 0o7777, mtime_ms: st.mtimeMs },
    });
    this.stopDrain = channel.onDrain(() => this.flow());
    this.flow();
  }

  credit(bytes: number): void {
    this.inflight = Math.max(0, this.inflight - bytes);
    this.flow();
  }

  cancel(): void {
    this.finish();
  }

  /** Schedules the next chunk unless one is scheduled or the window or the channel is full. */
  private flow(): void {
    if (this.done || this.fd === undefined || this.scheduled) return;
    if (this.sent < this.size && (this.inflight >= OUTPUT_WINDOW_BYTES || this.channel.isCongested)) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      this.step();
    });
  }

  private step(): void {
    if (this.done || this.fd === undefined) return;
    const { id, channel } = this;
    if (this.sent < this.size) {
      let n: number;
      const buf = Buffer.allocUnsafe(Math.min(OUTPUT_CHUNK_BYTES, this.size - this.sent));
      try {
        n = readAt(this.fd, buf, buf.length, this.sent);
      } catch (err) {
        this.end(err);
        return;
      }
      if (n > 0) {
        const chunk = buf.subarray(0, n);
        this.hash.update(chunk);
        this.sent += n;
        this.inflight += n;
        channel.send({ t: "file_chunk", id }, chunk);
      }
      // A file that shrank while read ends where its bytes did.
      if (n === buf.length) {
        this.flow();
        return;
      }
    }
    channel.send({ t: "file_done", id, size: this.sent, sha256: this.hash.digest("hex") });
    this.end();
  }

  private end(err?: unknown): void {
    if (this.done) return;
    this.finish();
    this.onEnd(err);
  }

  private finish(): void {
    this.done = true;
    this.stopDrain();
    if (this.fd !== undefined) closeSync(this.fd);
    this.fd = undefined;
  }
}

type WriteFrame = Extract<ParsedHostFrame, { t: "file_write" }>;

/**
 * An atomic write: data goes to a temporary file beside the target, which replaces the target by
 * rename only after fsync, so a reader sees the old file or the new one, never a mix. Each chunk
 * is written as it arrives: one frame's bytes, a bounded synchronous write.
 */
export class AtomicWrite {
  private tmpPath: string | undefined;
  private target: string;
  private fd: number | undefined;
  /** The first failure (the create, or a write): the commit reports it. */
  private failure: unknown;
  private readonly hash = createHash("sha256");
  private size = 0;

  constructor(private readonly frame: WriteFrame) {
    this.target = frame.path;
    try {
      // Work in the directory's real path: the temporary file and the rename must be in the same
      // directory, and gVisor refuses an exclusive create through a symlinked directory (EEXIST).
      const dir = realpathSync(dirname(frame.path));
      this.target = join(dir, basename(frame.path));
      this.tmpPath = join(dir, `.${basename(frame.path)}.bothy-${kernelRandomBytes(6).toString("hex")}`);
      this.fd = openSync(this.tmpPath, "wx", frame.mode ?? 0o644);
    } catch (err) {
      this.failure = err;
    }
  }

  /** Appends a chunk; chunks are written in the order they come. */
  write(data: Buffer): Promise<void> {
    if (this.failure !== undefined) return Promise.reject(this.failure);
    if (this.fd === undefined) return Promise.reject(new FileOpError("io_error", "the write was cancelled"));
    try {
      for (let off = 0; off < data.length;) off += writeSync(this.fd, data, off, data.length - off);
    } catch (err) {
      this.failure = err;
      return Promise.reject(err);
    }
    this.hash.update(data);
    this.size += data.length;
    return Promise.resolve();
  }

  async commit(): Promise<{ size: number; sha256: string }> {
    if (this.failure !== undefined) throw this.failure;
    const fd = this.fd;
    if (fd === undefined || this.tmpPath === undefined) throw new FileOpError("io_error", "the write was cancelled");
    this.fd = undefined;
    try {
      fsyncSync(fd);
      if (this.frame.mode !== undefined) fchmodSync(fd, this.frame.mode);
    } finally {
      closeSync(fd);
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
    renameSync(this.tmpPath, this.target);
    return { size: this.size, sha256: this.hash.digest("hex") };
  }

  async abort(): Promise<void> {
    if (this.fd !== undefined) closeSync(this.fd);
    this.fd = undefined;
    if (this.tmpPath === undefined) return;
    // Best effort: the temporary file may never have been created, or already renamed.
    try {
      unlinkSync(this.tmpPath);
    } catch {
      // nothing to remove
    }
  }
}
