import type { Readable, Writable } from "node:stream";
import {
  BothyError,
  encodeFrame,
  FrameDecoder,
  guestFrame,
  MAX_PAYLOAD_BYTES,
  PROTOCOL_GENERATION,
  type FileStat,
  type GuestFrame,
  type HostFrame,
  type SignalName,
} from "@bothy/protocol";

export interface ExecOptions {
  cmd: string;
  cwd?: string;
  env?: Record<string, string>;
  stdin?: boolean;
}

export interface ExecEvents {
  onStarted(pid: number): void;
  /** Output bytes; call `consumed()` once they have been passed on, to let more flow. */
  onOutput(fd: 1 | 2, data: Buffer, consumed: () => void): void;
  onExited(code: number | null, signal: string | null): void;
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
}

type Pending =
  | { kind: "exec"; events: ExecEvents }
  | { kind: "stat"; resolve: (s: FileStat) => void; reject: (e: BothyError) => void }
  | { kind: "read"; chunks: Buffer[]; size: number; limit: number; resolve: (b: Buffer) => void; reject: (e: BothyError) => void }
  | { kind: "write"; resolve: (r: { size: number; sha256: string }) => void; reject: (e: BothyError) => void }
  | { kind: "identity"; resolve: () => void; reject: (e: BothyError) => void };

export interface GuestIdentity {
  sandboxId: string;
  hostname: string;
  env: Record<string, string>;
  /** Fresh host randomness the guest credits to its kernel RNG (at least 32 bytes). */
  entropy: Buffer;
}

/**
 * The host's end of the guest-agent protocol over one byte stream: handshake, request ids,
 * multiplexed commands and file operations. Every frame from the guest is validated; a guest that
 * breaks the protocol is disconnected.
 */
export class AgentClient {
  private readonly decoder = new FrameDecoder();
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private closed: BothyError | undefined;
  private helloWaiter: { resolve: () => void; reject: (e: BothyError) => void } | undefined;
  private helloSeen = false;
  private readonly closeListeners = new Set<(reason: BothyError) => void>();

  constructor(
    private readonly input: Readable,
    private readonly output: Writable,
  ) {
    input.on("data", (chunk: Buffer) => this.onData(chunk));
    input.on("end", () => this.close(new BothyError("agent_unavailable", "The guest agent closed its channel.")));
    input.on("error", (err) => this.close(new BothyError("agent_unavailable", `Guest channel error: ${err.message}`)));
    output.on("error", (err) => this.close(new BothyError("agent_unavailable", `Guest channel error: ${err.message}`)));
  }

  /**
   * Resolves once the agent has said hello with our protocol generation. With `resync` the agent
   * is already running (a restored VM) and is asked to say hello again.
   */
  handshake(timeoutMs: number, signal?: AbortSignal, resync = false): Promise<void> {
    if (this.helloSeen) return Promise.resolve();
    if (this.closed) return Promise.reject(this.closed);
    if (resync) this.send({ t: "resync" });
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => fail(new BothyError("agent_unavailable", `The guest agent did not say hello within ${timeoutMs} ms.`)), timeoutMs);
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
  }

  get isClosed(): boolean {
    return this.closed !== undefined;
  }

  onClose(fn: (reason: BothyError) => void): () => void {
    this.closeListeners.add(fn);
    return () => this.closeListeners.delete(fn);
  }

  exec(options: ExecOptions, events: ExecEvents): ExecHandle {
    const id = this.allocate({ kind: "exec", events });
    this.send({ t: "exec", id, cmd: options.cmd, cwd: options.cwd, env: options.env, stdin: options.stdin ?? false });
    return new ExecHandle(this, id);
  }

  stat(path: string): Promise<FileStat> {
    return new Promise((resolve, reject) => {
      const id = this.allocate({ kind: "stat", resolve, reject });
      this.send({ t: "stat", id, path });
    });
  }

  readFile(path: string, limit = 64 * 1024 * 1024): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      const id = this.allocate({ kind: "read", chunks: [], size: 0, limit, resolve, reject });
      this.send({ t: "file_read", id, path });
    });
  }

  writeFile(path: string, data: Buffer, options: { mode?: number; ifSha256?: string } = {}): Promise<{ size: number; sha256: string }> {
    return new Promise((resolve, reject) => {
      const id = this.allocate({ kind: "write", resolve, reject });
      this.send({ t: "file_write", id, path, mode: options.mode, if_sha256: options.ifSha256 });
      let off = 0;
      do {
        const part = data.subarray(off, off + MAX_PAYLOAD_BYTES);
        off += part.length;
        this.send({ t: "file_chunk", id, eof: off >= data.length }, part);
      } while (off < data.length);
    });
  }

  /** Tells the guest who it is (see the `identity` frame); resolves once it has applied it. */
  identify(identity: GuestIdentity): Promise<void> {
    return new Promise((resolve, reject) => {
      const id = this.allocate({ kind: "identity", resolve, reject });
      this.send({ t: "identity", id, sandbox_id: identity.sandboxId, hostname: identity.hostname, env: identity.env, time_ms: Date.now() }, identity.entropy);
    });
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
    for (const [, p] of this.pending) {
      if (p.kind === "exec") p.events.onError(reason);
      else p.reject(reason);
    }
    this.pending.clear();
    for (const fn of this.closeListeners) fn(reason);
    this.input.destroy();
    this.output.destroy();
  }

  private allocate(p: Pending): number {
    if (this.closed) throw this.closed;
    const id = this.nextId;
    this.nextId = this.nextId >= 2 ** 31 - 1 ? 1 : this.nextId + 1;
    this.pending.set(id, p);
    return id;
  }

  private onData(chunk: Buffer): void {
    let frames;
    try {
      frames = this.decoder.push(chunk);
    } catch (err) {
      this.close(new BothyError("agent_protocol_error", `The guest agent sent a malformed frame: ${(err as Error).message}`));
      return;
    }
    for (const raw of frames) {
      const parsed = guestFrame.safeParse(raw.header);
      if (!parsed.success) {
        this.close(new BothyError("agent_protocol_error", `The guest agent sent an invalid frame: ${parsed.error.issues[0]?.message ?? "unknown"}`));
        return;
      }
      this.dispatch(parsed.data, raw.payload);
      if (this.closed) return;
    }
  }

  private dispatch(frame: GuestFrame, payload: Buffer): void {
    if (frame.t === "hello") {
      if (frame.gen !== PROTOCOL_GENERATION) {
        this.close(new BothyError("agent_protocol_error", `The guest agent speaks protocol generation ${frame.gen}, the server ${PROTOCOL_GENERATION}; rebuild the agent.`));
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
        if (p.kind === "exec") p.events.onOutput(frame.fd, payload, () => this.send({ t: "credit", id, bytes: Math.max(1, payload.length) }));
        return;
      case "exited":
        this.pending.delete(id);
        if (p.kind === "exec") p.events.onExited(frame.code, frame.signal);
        return;
      case "identity_done":
        this.pending.delete(id);
        if (p.kind === "identity") p.resolve();
        return;
      case "stat_result":
        this.pending.delete(id);
        if (p.kind === "stat") p.resolve(frame.stat);
        return;
      case "file_chunk":
        if (p.kind !== "read") return;
        p.size += payload.length;
        if (p.size > p.limit) {
          this.pending.delete(id);
          p.reject(new BothyError("file_error", `The file is larger than ${p.limit} bytes.`));
          return;
        }
        p.chunks.push(Buffer.from(payload));
        return;
      case "file_done":
        this.pending.delete(id);
        if (p.kind === "read") p.resolve(Buffer.concat(p.chunks));
        else if (p.kind === "write") p.resolve({ size: frame.size, sha256: frame.sha256 });
        return;
      case "error": {
        const err = new BothyError(frame.code === "not_found" ? "file_not_found" : "file_error", frame.message, { details: { guest_code: frame.code } });
        if (p.kind === "exec") {
          if (frame.code === "spawn_failed") p.events.onError(new BothyError("invalid_command", `The command could not start: ${frame.message}`));
          return; // an exec still ends with its own `exited` frame
        }
        this.pending.delete(id);
        p.reject(err);
        return;
      }
    }
  }
}
