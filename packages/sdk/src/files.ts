/**
 * `sandbox.files`: the sandbox's filesystem through the files API. Paths are resolved inside the
 * sandbox (relative ones from /workspace). Reads and writes stream both ways, so large files
 * never need to fit in memory: read with `format: "stream"`, write a ReadableStream or any async
 * iterable of bytes (a Node fs.ReadStream).
 */
import { dirListing, fileStatResult, fileWriteResult } from "@bothy/protocol";
import { z } from "zod";
import { NotFoundError, ConflictError } from "./errors.ts";
import type { CallOptions, HttpClient, RequestBody } from "./http-client.ts";

export type FileType = "file" | "dir" | "symlink" | "other";

export interface EntryInfo {
  name: string;
  /** The entry's path: the listed directory joined with its name. */
  path: string;
  type: FileType;
  size: number;
  /** Permission bits, e.g. 0o644. */
  mode: number;
  mtime: Date;
}

export interface FileInfo extends Omit<EntryInfo, "name"> {
  /** With `sha256: true`: the content hash of a regular file, for `write(..., {ifMatch})`. */
  sha256?: string;
}

export interface WriteInfo {
  path: string;
  size: number;
  sha256: string;
}

/** What `write` accepts: text, bytes, a Blob, a web stream, or any async iterable of bytes. */
export type WriteData =
  string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;

export interface WriteOptions extends CallOptions {
  /** Permission bits for the file, e.g. 0o755 or "755". */
  mode?: number | string;
  /** Write only if the file's sha256 is still this (optimistic concurrency); else ConflictError. */
  ifMatch?: string;
}

const okAnswer = z.looseObject({});

function joinPath(dir: string, name: string): string {
  return dir.endsWith("/") ? `${dir}${name}` : `${dir}/${name}`;
}

function toStream(data: AsyncIterable<Uint8Array>): ReadableStream<Uint8Array> {
  const it = data[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const next = await it.next();
      if (next.done) controller.close();
      else controller.enqueue(next.value);
    },
    async cancel(reason) {
      await it.return?.(reason);
    },
  });
}

function toBody(data: WriteData): RequestBody {
  if (typeof data === "string" || data instanceof Blob || data instanceof ReadableStream || data instanceof ArrayBuffer)
    return data;
  if (data instanceof Uint8Array) return data;
  return toStream(data);
}

export class Files {
  /** @internal */
  constructor(
    private readonly http: HttpClient,
    private readonly sandboxId: string,
  ) {}

  private path(suffix = ""): string {
    return `/sandboxes/${this.sandboxId}/files${suffix}`;
  }

  /** Reads a file: as text (default), bytes, or a stream that is read as it arrives. */
  read(path: string, options?: CallOptions & { format?: "text" }): Promise<string>;
  read(path: string, options: CallOptions & { format: "bytes" }): Promise<Uint8Array>;
  read(path: string, options: CallOptions & { format: "stream" }): Promise<ReadableStream<Uint8Array>>;
  async read(
    path: string,
    options: CallOptions & { format?: "text" | "bytes" | "stream" } = {},
  ): Promise<string | Uint8Array | ReadableStream<Uint8Array>> {
    const res = await this.http.fetch("GET", this.path(), { query: { path }, timeout: false, ...signalOf(options) });
    if (options.format === "stream") return res.body ?? new ReadableStream<Uint8Array>({ start: (c) => c.close() });
    if (options.format === "bytes") return new Uint8Array(await res.arrayBuffer());
    return res.text();
  }

  /** Replaces the file atomically with `data` (parent directories must exist). */
  async write(path: string, data: WriteData, options: WriteOptions = {}): Promise<WriteInfo> {
    const mode = typeof options.mode === "number" ? options.mode.toString(8) : options.mode;
    return this.http.json("PUT", this.path(), fileWriteResult, {
      query: { path, mode },
      rawBody: toBody(data),
      headers: {
        "content-type": "application/octet-stream",
        ...(options.ifMatch === undefined ? {} : { "if-match": `"${options.ifMatch}"` }),
      },
      timeout: false,
      ...signalOf(options),
    });
  }

  async stat(path: string, options: CallOptions & { sha256?: boolean } = {}): Promise<FileInfo> {
    const s = await this.http.json("GET", this.path("/stat"), fileStatResult, {
      query: { path, sha256: options.sha256 ? "true" : undefined },
      ...signalOf(options),
    });
    return {
      path: s.path,
      type: s.type,
      size: s.size,
      mode: s.mode,
      mtime: new Date(s.mtime_ms),
      ...(s.sha256 === undefined ? {} : { sha256: s.sha256 }),
    };
  }

  /** Whether anything exists at `path`. */
  async exists(path: string, options: CallOptions = {}): Promise<boolean> {
    try {
      await this.stat(path, options);
      return true;
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  /** The directory's entries (at most 5000; see `truncated` on the raw API for more). */
  async list(path: string, options: CallOptions = {}): Promise<EntryInfo[]> {
    const l = await this.http.json("GET", this.path("/list"), dirListing, { query: { path }, ...signalOf(options) });
    return l.entries.map((e) => ({
      name: e.name,
      path: joinPath(l.path, e.name),
      type: e.type,
      size: e.size,
      mode: e.mode,
      mtime: new Date(e.mtime_ms),
    }));
  }

  /** Makes a directory (and, unless `parents: false`, its parents); answers false when it already existed. */
  async makeDir(path: string, options: CallOptions & { parents?: boolean } = {}): Promise<boolean> {
    // Without parents the server says whether it existed; with them (mkdir -p) it would not.
    const mkdir = (parents: boolean): Promise<unknown> =>
      this.http.json("POST", this.path("/mkdir"), okAnswer, { body: { path, parents }, ...signalOf(options) });
    try {
      await mkdir(false);
      return true;
    } catch (err) {
      if (err instanceof ConflictError && err.code === "file_exists") return false;
      if (!(err instanceof NotFoundError) || options.parents === false) throw err;
    }
    await mkdir(true);
    return true;
  }

  /** Removes a file, or a directory (a non-empty one needs `recursive: true`). */
  async remove(path: string, options: CallOptions & { recursive?: boolean } = {}): Promise<void> {
    await this.http.json("DELETE", this.path(), okAnswer, {
      query: { path, recursive: options.recursive ? "true" : undefined },
      ...signalOf(options),
    });
  }

  async rename(from: string, to: string, options: CallOptions = {}): Promise<FileInfo> {
    await this.http.json("POST", this.path("/rename"), okAnswer, { body: { from, to }, ...signalOf(options) });
    return this.stat(to, options);
  }
}

function signalOf(options: CallOptions): CallOptions {
  return options.signal ? { signal: options.signal } : {};
}
