import type { Readable, Writable } from "node:stream";
import {
  BothyError,
  dirEntries,
  encodeFrame,
  FrameDecoder,
  guestFrame,
  MAX_PAYLOAD_BYTES,
  OUTPUT_WINDOW_BYTES,
  PROTOCOL_GENERATION,
  UPLOAD_WINDOW_BYTES,
  type DirEntry,
  type ErrorCode,
  type FileStat,
  type GuestFrame,
  type HostFrame,
  type SignalName,
} from "@bothy/protocol";
import { ReadSink } from "./read-sink.ts";
import { TcpStream } from "./tcp-stream.ts";

export interface ExecOptions {
  cmd: string;
  cwd?: string;
  env?: Record<string, string>;
  stdin?: boolean;
  pty?: { cols: number; rows: number };
}

export interface ExecEvents {
  onStarted(pid: number): void;
  /** Output bytes; call `consumed()` once they have been passed on, to let more flow. */
  onOutput(fd: 1 | 2, data: Buffer, consumed: () => void): void;
  onExited(code: number | null, signal: string | null, oomKilled?: boolean): void;
  onError(err: BothyError): void;
}

/** A running command inside the guest. */
export class ExecHandle {
  constructor(
    private readonly client: AgentClient,
    readonly requestId: number,
  ) {}

  stdin(data: Buffer, eof = false): void {
    for (let off = 0; off < data.length || (off === 0 && eof); off += MAX_PAYLOAD_BYTES) {
      const part = data.subarray(off, off + MAX_PAYLOAD_BYTES);
      const last = off + MAX_PAYLOAD_BYTES >= data.length;
      this.client.send({ t: "stdin", id: this.requestId, eof: eof && last }, part);
      if (last) break;
    }
  }

  signal(signal: SignalName): void {
    this.client.send({ t: "signal", id: this.requestId, signal });
  }

  resize(cols: number, rows: number): void {
    this.client.send({ t: "resize", id: this.requestId, cols, rows });
  }
}

type Pending =
  | { kind: "exec"; events: ExecEvents }
  | { kind: "stat"; resolve: (s: FileStat) => void; reject: (e: BothyError) => void }
  | { kind: "read"; sink: ReadSink; opened: (stat: FileStat) => void; reject: (e: BothyError) => void }
  | {
      kind: "write";
      resolve: (r: { size: number; sha256: string }) => void;
      reject: (e: BothyError) => void;
      acked: (bytes: number) => void;
    }
  | { kind: "list"; resolve: (r: { entries: DirEntry[]; truncated: boolean }) => void; reject: (e: BothyError) => void }
  | { kind: "done"; resolve: () => void; reject: (e: BothyError) => void }
  | { kind: "identity"; resolve: () => void; reject: (e: BothyError) => void }
  | { kind: "ports"; resolve: (ports: ListeningPort[]) => void; reject: (e: BothyError) => void }
  | { kind: "tcp"; stream: TcpStream; opened: () => void; reject: (e: BothyError) => void };

export interface ListeningPort {
  port: number;
  address: string;
}

export interface GuestIdentity {
  sandboxId: string;
  hostname: string;
  env: Record<string, string>;
  /** Fresh host randomness the guest credits to its kernel RNG (at least 32 bytes). */
  entropy: Buffer;
}

/** Output credit is sent back once this much is owed to a command, or after CREDIT_DELAY_MS. */
const CREDIT_BATCH_BYTES = OUTPUT_WINDOW_BYTES / 8;
const CREDIT_DELAY_MS = 10;

/**
 * How long a file request may wait on the guest: for its answer, or, while a transfer is under
 * way, for the guest's next step (a reader or uploader that is slow itself does not count).
 */
export const FILE_TIMEOUT_MS = 120_000;
/** How long opening a connection to a port inside the guest may take. */
export const CONNECT_TIMEOUT_MS = 15_000;

/** How every hello header starts (the agent encodes `{ t: "hello", ... }` with JSON.stringify). */
const HELLO_MARKER = Buffer.from('{"t":"hello"');
const MAX_HELLO_HEADER_BYTES = 1024;

/**
 * The host's end of the guest-agent protocol over one byte stream: handshake, request ids,
 * multiplexed commands and file operations. Every frame from the guest is validated; a guest that
 * breaks the protocol is disconnected.
 */
export class AgentClient {
  private readonly decoder = new FrameDecoder();
  private readonly pending = new Map<number, Pending>();
  /** Output credit not yet sent back, per command (see creditOutput). */
  private readonly owedCredit = new Map<number, number>();
  private creditTimer: NodeJS.Timeout | undefined;
  private nextId = 1;
  private closed: BothyError | undefined;
  /** Variables every command gets beneath its own (SandboxSpec.commandEnv). */
  commandEnv: Record<string, string> = {};
  private helloWaiter: { resolve: () => void; reject: (e: BothyError) => void } | undefined;
  private helloSeen = false;
  /** Re-attached to a running agent: until its hello, the stream may start mid-frame. */
  private hunting = false;
  /** Told when the channel closes without the host asking (the guest ended, or broke the protocol). */
  private readonly lostListeners = new Set<(reason: BothyError) => void>();
  /** Told when the channel closes for any reason (see onClose). */
  private readonly closeListeners = new Set<() => void>();
  /** The deadline of each request now waiting on the guest (see FILE_TIMEOUT_MS). */
  private readonly deadlines = new Map<number, NodeJS.Timeout>();
  private readonly fileTimeoutMs: number;

  constructor(
    private readonly input: Readable,
    private readonly output: Writable,
    options: { fileTimeoutMs?: number } = {},
  ) {
    this.fileTimeoutMs = options.fileTimeoutMs ?? FILE_TIMEOUT_MS;
    input.on("data", (chunk: Buffer) => this.onData(chunk));
    input.on("end", () => this.lose(new BothyError("agent_unavailable", "The guest agent closed its channel.")));
    input.on("error", (err) => this.lose(new BothyError("agent_unavailable", `Guest channel error: ${err.message}`)));
    output.on("error", (err) => this.lose(new BothyError("agent_unavailable", `Guest channel error: ${err.message}`)));
  }

  /**
   * Resolves once the agent has said hello with our protocol generation. With `resync` the agent
   * is already running (a restored VM) and is asked to say hello again.
   */
  handshake(timeoutMs: number, signal?: AbortSignal, resync = false): Promise<void> {
    if (this.helloSeen) return Promise.resolve();
    if (this.closed) return Promise.reject(this.closed);
    const handshake = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => fail(new BothyError("agent_unavailable", `The guest agent did not say hello within ${timeoutMs} ms.`)),
        timeoutMs,
      );
      const onAbort = (): void => fail(new BothyError("agent_unavailable", "Handshake aborted."));
      const fail = (e: BothyError): void => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        this.helloWaiter = undefined;
        reject(e);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.helloWaiter = {
        resolve: () => {
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
          this.helloWaiter = undefined;
          resolve();
        },
        reject: fail,
      };
    });
    // Asked only once the hello is listened for: the answer may come in the same turn.
    if (resync) {
      this.hunting = true;
      this.send({ t: "resync" });
    }
    return handshake;
  }

  get isClosed(): boolean {
    return this.closed !== undefined;
  }

  /**
   * Calls `fn` when the channel closes without the host's `close()`: the guest's end closed it, or
   * the agent broke the protocol. The requests still waiting have failed by then.
   */
  onLost(fn: (reason: BothyError) => void): () => void {
    this.lostListeners.add(fn);
    return () => this.lostListeners.delete(fn);
  }

  /**
   * Calls `fn` once the channel is closed, by `close()` or under the host; at once if it already
   * is. What lives beside the channel (a port connection made over the sandbox's network) ends with
   * it, as its own streams do.
   */
  onClose(fn: () => void): () => void {
    if (this.closed) {
      fn();
      return () => undefined;
    }
    this.closeListeners.add(fn);
    return () => this.closeListeners.delete(fn);
  }

  exec(options: ExecOptions, events: ExecEvents): ExecHandle {
    const id = this.allocate({ kind: "exec", events });
    this.send({
      t: "exec",
      id,
      cmd: options.cmd,
      cwd: options.cwd,
      env: { ...this.commandEnv, ...options.env },
      stdin: options.stdin ?? false,
      pty: options.pty,
    });
    return new ExecHandle(this, id);
  }

  stat(path: string, options: { sha256?: boolean } = {}): Promise<FileStat> {
    return new Promise((resolve, reject) => {
      const id = this.allocate({ kind: "stat", resolve, reject });
      this.send({ t: "stat", id, path, sha256: options.sha256 });
      this.arm(id, `stat ${path}`);
    });
  }

  list(path: string): Promise<{ entries: DirEntry[]; truncated: boolean }> {
    return new Promise((resolve, reject) => {
      const id = this.allocate({ kind: "list", resolve, reject });
      this.send({ t: "list", id, path });
      this.arm(id, `list ${path}`);
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
    return new Promise((resolve, reject) => {
      const id = this.allocate({ kind: "done", resolve, reject });
      this.send(frame(id));
      this.arm(id, what);
    });
  }

  /**
   * Opens a file in the guest (following symlinks) and streams it out. Resolves once the guest
   * has opened it, with the stat of the file it opened: the stream is exactly `stat.size` long.
   * The guest sends at most a credit window ahead of what the stream's reader has taken, so a
   * slow reader never makes anything buffer the file.
   */
  openRead(path: string): Promise<{ stat: FileStat; stream: Readable }> {
    return new Promise((resolve, reject) => {
      let opened = false;
      const sink = new ReadSink(
        (bytes) => this.send({ t: "credit", id, bytes }),
        (waiting) => (waiting ? this.arm(id, `read ${path}`) : this.disarm(id)),
      );
      const id = this.allocate({
        kind: "read",
        sink,
        opened: (stat) => {
          opened = true;
          sink.expect(stat.size);
          resolve({ stat, stream: sink });
        },
        reject: (e) => {
          // Before the open nobody reads the stream, so only the promise carries the error.
          if (opened) sink.fail(e);
          else {
            sink.destroy();
            reject(e);
          }
        },
      });
      sink.onCancel(() => {
        this.settle(id);
        this.send({ t: "cancel", id });
      });
      this.send({ t: "file_read", id, path });
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
    const id = this.allocate({
      kind: "write",
      resolve: (r) => resolveDone(r),
      reject: (e) => {
        failure = e;
        rejectDone(e);
        wake?.();
      },
      acked: (bytes) => {
        inflight -= bytes;
        // After the last chunk the guest owes the commit: each ack restarts its deadline.
        if (eofSent) this.arm(id, `write ${path}`);
        wake?.();
      },
    });
    this.send({ t: "file_write", id, path, mode: options.mode, if_sha256: options.ifSha256 });
    try {
      for await (const chunk of source) {
        const buf = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
        for (let off = 0; off < buf.length; off += MAX_PAYLOAD_BYTES) {
          const part = buf.subarray(off, off + MAX_PAYLOAD_BYTES);
          while (inflight + part.length > UPLOAD_WINDOW_BYTES && !failure) {
            this.arm(id, `write ${path}`);
            await new Promise<void>((r) => (wake = r));
            this.disarm(id);
          }
          if (failure) throw failure;
          inflight += part.length;
          this.send({ t: "file_chunk", id, eof: false }, part);
        }
      }
    } catch (err) {
      // Never commit a partial upload: the guest removes its temporary file.
      this.settle(id);
      this.send({ t: "cancel", id });
      throw err instanceof BothyError
        ? err
        : new BothyError("file_error", `Upload aborted: ${(err as Error).message}`, { cause: err });
    }
    this.send({ t: "file_chunk", id, eof: true });
    eofSent = true;
    this.arm(id, `write ${path}`);
    return done;
  }

  /** The TCP sockets listening inside the guest. */
  listPorts(): Promise<ListeningPort[]> {
    return new Promise((resolve, reject) => {
      const id = this.allocate({ kind: "ports", resolve, reject });
      this.send({ t: "ports_list", id });
      this.arm(id, "ports_list");
    });
  }

  /**
   * Opens a TCP connection to `port` on the guest's loopback, relayed over the guest channel.
   * Fails with `port_not_listening` when nothing listens there, `agent_timeout` when the guest
   * has not connected within the connect timeout. Destroying the stream resets the guest's socket.
   */
  openTcp(port: number): Promise<TcpStream> {
    return new Promise((resolve, reject) => {
      let opened = false;
      const stream = new TcpStream({
        data: (payload, eof) => this.send({ t: "tcp_data", id, eof }, payload),
        credit: (bytes) => this.creditOutput(id, bytes),
        cancel: () => {
          this.settle(id);
          this.owedCredit.delete(id);
          this.send({ t: "cancel", id });
        },
      });
      const id = this.allocate({
        kind: "tcp",
        stream,
        opened: () => {
          opened = true;
          resolve(stream);
        },
        reject: (e) => {
          if (opened) stream.destroy(e);
          else {
            stream.destroy();
            reject(e);
          }
        },
      });
      this.send({ t: "tcp_open", id, port });
      this.arm(id, `connect to port ${port}`, CONNECT_TIMEOUT_MS);
    });
  }

  /** Tells the guest who it is (see the `identity` frame); resolves once it has applied it. */
  identify(identity: GuestIdentity): Promise<void> {
    return new Promise((resolve, reject) => {
      const id = this.allocate({ kind: "identity", resolve, reject });
      this.send(
        {
          t: "identity",
          id,
          sandbox_id: identity.sandboxId,
          hostname: identity.hostname,
          env: identity.env,
          time_ms: Date.now(),
        },
        identity.entropy,
      );
      this.arm(id, "identity");
    });
  }

  /** Gives the guest its limits (see the `limits` frame); resolves once it has applied them. */
  applyLimits(limits: { maxProcesses: number; rootBytes?: number }): Promise<void> {
    return new Promise((resolve, reject) => {
      const id = this.allocate({ kind: "done", resolve, reject });
      this.send({ t: "limits", id, max_processes: limits.maxProcesses, root_bytes: limits.rootBytes });
      this.arm(id, "limits");
    });
  }

  /**
   * Output a client has taken is credited back to the guest in batches: each credit is a frame
   * the agent must read, on the same (in an emulated VM, slow) CPU as the command it serves.
   */
  private creditOutput(id: number, bytes: number): void {
    const owed = (this.owedCredit.get(id) ?? 0) + bytes;
    if (owed >= CREDIT_BATCH_BYTES) {
      this.owedCredit.delete(id);
      this.send({ t: "credit", id, bytes: owed });
      return;
    }
    this.owedCredit.set(id, owed);
    this.creditTimer ??= setTimeout(() => {
      this.creditTimer = undefined;
      for (const [owedId, owedBytes] of this.owedCredit) this.send({ t: "credit", id: owedId, bytes: owedBytes });
      this.owedCredit.clear();
    }, CREDIT_DELAY_MS);
  }

  /** @internal */
  send(frame: HostFrame, payload?: Buffer): void {
    if (this.closed) return;
    const clean = Object.fromEntries(Object.entries(frame).filter(([, v]) => v !== undefined));
    this.output.write(encodeFrame(clean, payload));
  }

  close(reason: BothyError): void {
    if (this.closed) return;
    this.closed = reason;
    this.helloWaiter?.reject(reason);
    clearTimeout(this.creditTimer);
    this.owedCredit.clear();
    for (const timer of this.deadlines.values()) clearTimeout(timer);
    this.deadlines.clear();
    for (const [, p] of this.pending) {
      if (p.kind === "exec") p.events.onError(reason);
      else p.reject(reason);
    }
    this.pending.clear();
    this.input.destroy();
    this.output.destroy();
    const listeners = [...this.closeListeners];
    this.closeListeners.clear();
    for (const fn of listeners) fn();
  }

  /** The channel closed under the host: closed as by `close()`, then the `onLost` listeners told. */
  private lose(reason: BothyError): void {
    if (this.closed) return;
    this.close(reason);
    for (const fn of this.lostListeners) fn(reason);
  }

  /**
   * Starts (or restarts) request `id`'s deadline: if the guest has not moved it on within the
   * file timeout, the request fails with `agent_timeout` and the guest is told to drop it. The
   * channel and every other request carry on.
   */
  private arm(id: number, what: string, timeoutMs = this.fileTimeoutMs): void {
    if (!this.pending.has(id)) return;
    clearTimeout(this.deadlines.get(id));
    this.deadlines.set(
      id,
      setTimeout(() => {
        const p = this.pending.get(id);
        this.settle(id);
        if (!p) return;
        this.send({ t: "cancel", id });
        const err = new BothyError(
          "agent_timeout",
          `The guest agent did not answer (${what}) within ${timeoutMs} ms; the request was abandoned, the sandbox is still usable.`,
        );
        if (p.kind === "exec") p.events.onError(err);
        else p.reject(err);
      }, timeoutMs),
    );
  }

  private disarm(id: number): void {
    clearTimeout(this.deadlines.get(id));
    this.deadlines.delete(id);
  }

  /** Request `id` is over: no frame or deadline reaches it any more. */
  private settle(id: number): void {
    this.pending.delete(id);
    this.disarm(id);
  }

  private allocate(p: Pending): number {
    if (this.closed) throw this.closed;
    const id = this.nextId;
    this.nextId = this.nextId >= 2 ** 31 - 1 ? 1 : this.nextId + 1;
    this.pending.set(id, p);
    return id;
  }

  private onData(chunk: Buffer): void {
    if (this.hunting) {
      // Whatever the agent sent before its hello may be the tail of a frame for a host that is gone.
      this.decoder.append(chunk);
      if (!this.decoder.seek(HELLO_MARKER, (head, payload) => head <= MAX_HELLO_HEADER_BYTES && payload === 0)) return;
      this.hunting = false;
      chunk = Buffer.alloc(0);
    }
    let frames;
    try {
      frames = this.decoder.push(chunk);
    } catch (err) {
      this.lose(
        new BothyError("agent_protocol_error", `The guest agent sent a malformed frame: ${(err as Error).message}`),
      );
      return;
    }
    for (const raw of frames) {
      const parsed = guestFrame.safeParse(raw.header);
      if (!parsed.success) {
        this.lose(
          new BothyError(
            "agent_protocol_error",
            `The guest agent sent an invalid frame: ${parsed.error.issues[0]?.message ?? "unknown"}`,
          ),
        );
        return;
      }
      this.dispatch(parsed.data, raw.payload);
      if (this.closed) return;
    }
  }

  private dispatch(frame: GuestFrame, payload: Buffer): void {
    if (frame.t === "hello") {
      if (frame.gen !== PROTOCOL_GENERATION) {
        this.lose(
          new BothyError(
            "agent_protocol_error",
            `The guest agent speaks protocol generation ${frame.gen}, the server ${PROTOCOL_GENERATION}; rebuild the agent.`,
          ),
        );
        return;
      }
      this.send({ t: "hello_ack", gen: PROTOCOL_GENERATION });
      if (!this.helloSeen) {
        this.helloSeen = true;
        this.helloWaiter?.resolve();
      }
      return;
    }
    const p = frame.id === undefined ? undefined : this.pending.get(frame.id);
    if (!p || frame.id === undefined) return; // late frames of a finished request
    const id = frame.id;
    switch (frame.t) {
      case "started":
        if (p.kind === "exec") p.events.onStarted(frame.pid);
        return;
      case "output":
        if (p.kind === "exec")
          p.events.onOutput(frame.fd, payload, () => this.creditOutput(id, Math.max(1, payload.length)));
        return;
      case "exited":
        this.settle(id);
        this.owedCredit.delete(id);
        if (p.kind === "exec") p.events.onExited(frame.code, frame.signal, frame.oom_killed === true);
        return;
      case "identity_done":
        this.settle(id);
        if (p.kind === "identity") p.resolve();
        return;
      case "stat_result":
        if (p.kind === "read") {
          this.disarm(id);
          p.opened(frame.stat);
          p.sink.watch();
          return;
        }
        this.settle(id);
        if (p.kind === "stat") p.resolve(frame.stat);
        return;
      case "list_result": {
        this.settle(id);
        if (p.kind !== "list") return;
        const entries = parseEntries(payload);
        if (entries) p.resolve({ entries, truncated: frame.truncated });
        else this.lose(new BothyError("agent_protocol_error", "The guest agent sent an invalid directory listing."));
        return;
      }
      case "done":
        this.settle(id);
        if (p.kind === "done") p.resolve();
        return;
      case "ports_result":
        this.settle(id);
        if (p.kind === "ports") p.resolve(frame.ports);
        return;
      case "tcp_opened":
        this.disarm(id);
        if (p.kind === "tcp") p.opened();
        return;
      case "tcp_data":
        if (p.kind === "tcp") p.stream.received(payload, frame.eof);
        return;
      case "tcp_ack":
        if (p.kind === "tcp") p.stream.acked(frame.bytes);
        return;
      case "tcp_closed":
        this.settle(id);
        this.owedCredit.delete(id);
        if (p.kind === "tcp") p.stream.guestClosed(frame.error);
        return;
      case "file_ack":
        if (p.kind === "write") p.acked(frame.bytes);
        return;
      case "file_chunk":
        if (p.kind === "read") p.sink.chunk(payload);
        return;
      case "file_done":
        this.settle(id);
        if (p.kind === "read") p.sink.end();
        else if (p.kind === "write") p.resolve({ size: frame.size, sha256: frame.sha256 });
        return;
      case "error": {
        const err = guestFileError(frame.code, frame.message);
        if (p.kind === "exec") {
          if (frame.code === "spawn_failed")
            p.events.onError(new BothyError("invalid_command", `The command could not start: ${frame.message}`));
          return; // an exec still ends with its own `exited` frame
        }
        this.settle(id);
        if (p.kind === "tcp")
          p.reject(
            new BothyError(frame.code === "refused" ? "port_not_listening" : "agent_unavailable", frame.message, {
              details: { guest_code: frame.code },
            }),
          );
        else p.reject(err);
        return;
      }
    }
  }
}

const GUEST_FILE_ERRORS: Partial<Record<string, ErrorCode>> = {
  not_found: "file_not_found",
  exists: "file_exists",
  precondition_failed: "precondition_failed",
};

function guestFileError(code: string, message: string): BothyError {
  return new BothyError(GUEST_FILE_ERRORS[code] ?? "file_error", message, { details: { guest_code: code } });
}

function parseEntries(payload: Buffer): DirEntry[] | undefined {
  try {
    const parsed = dirEntries.safeParse(JSON.parse(payload.toString("utf8")));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}
