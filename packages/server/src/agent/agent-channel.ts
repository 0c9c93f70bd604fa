/**
 * The host's end of the guest-agent protocol as one frame channel over a byte stream: framing,
 * the hello handshake (and the resync of an agent already running), request ids with a deadline
 * each, output credit, and the loss of the channel. Every frame from the guest is validated; a
 * guest that breaks the protocol is disconnected. What a request does with its frames is its
 * own handler's business (the per-feature clients beside this file); the channel only routes.
 */
import type { Readable, Writable } from "node:stream";
import {
  BothyError,
  encodeFrame,
  FrameDecoder,
  guestFrame,
  OUTPUT_WINDOW_BYTES,
  PROTOCOL_GENERATION,
  type ErrorCode,
  type GuestFrame,
  type HostFrame,
} from "@bothy/protocol";

/** A guest frame that belongs to a request (every frame but `hello`). */
export type RequestFrame = Exclude<GuestFrame, { t: "hello" }>;

/** One request waiting on the guest: the frames sent for its id go to it until it is settled. */
export interface PendingRequest {
  /**
   * A frame for this request; false when it is not one this request takes. An `error` frame not
   * taken settles the request and fails it; any other frame not taken that ends a request settles
   * it without an answer, and a `tcp_opened` not taken stops its deadline.
   */
  frame(frame: RequestFrame, payload: Buffer): boolean;
  /** The request failed: an `error` frame, its deadline, or the channel closing. */
  fail(err: BothyError): void;
}

/** Output credit is sent back once this much is owed to a request, or after CREDIT_DELAY_MS. */
const CREDIT_BATCH_BYTES = OUTPUT_WINDOW_BYTES / 8;
const CREDIT_DELAY_MS = 10;

/**
 * How long a file request may wait on the guest: for its answer, or, while a transfer is under
 * way, for the guest's next step (a reader or uploader that is slow itself does not count).
 */
export const FILE_TIMEOUT_MS = 120_000;

/** How every hello header starts (the agent encodes `{ t: "hello", ... }` with JSON.stringify). */
const HELLO_MARKER = Buffer.from('{"t":"hello"');
const MAX_HELLO_HEADER_BYTES = 1024;

/** Frames that end whatever request they name, taken or not. */
const ENDS_A_REQUEST = new Set<RequestFrame["t"]>([
  "exited",
  "identity_done",
  "stat_result",
  "list_result",
  "done",
  "ports_result",
  "tcp_closed",
  "file_done",
]);

export class AgentChannel {
  private readonly decoder = new FrameDecoder();
  private readonly pending = new Map<number, PendingRequest>();
  /** Output credit not yet sent back, per request (see creditOutput). */
  private readonly owedCredit = new Map<number, number>();
  private creditTimer: NodeJS.Timeout | undefined;
  private nextId = 1;
  private closed: BothyError | undefined;
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
  readonly fileTimeoutMs: number;

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

  /** A new request id whose frames go to `p`; throws when the channel is closed. */
  allocate(p: PendingRequest): number {
    if (this.closed) throw this.closed;
    const id = this.nextId;
    this.nextId = this.nextId >= 2 ** 31 - 1 ? 1 : this.nextId + 1;
    this.pending.set(id, p);
    return id;
  }

  /**
   * A request the guest answers with one frame of kind `answer`: sent, its deadline armed, and
   * resolved (once settled) with what `read` takes from that frame.
   */
  request<K extends RequestFrame["t"], V>(
    what: string,
    frame: (id: number) => HostFrame,
    answer: K,
    read: (frame: Extract<RequestFrame, { t: K }>) => V,
    payload?: Buffer,
  ): Promise<V> {
    return new Promise((resolve, reject) => {
      const id = this.allocate({
        frame: (f) => {
          if (f.t !== answer) return false;
          this.settle(id);
          resolve(read(f as Extract<RequestFrame, { t: K }>));
          return true;
        },
        fail: reject,
      });
      this.send(frame(id), payload);
      this.arm(id, what);
    });
  }

  send(frame: HostFrame, payload?: Buffer): void {
    if (this.closed) return;
    const clean = Object.fromEntries(Object.entries(frame).filter(([, v]) => v !== undefined));
    this.output.write(encodeFrame(clean, payload));
  }

  /**
   * Output a client has taken is credited back to the guest in batches: each credit is a frame
   * the agent must read, on the same (in an emulated VM, slow) CPU as the command it serves.
   */
  creditOutput(id: number, bytes: number): void {
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

  /** Request `id` ended: the credit still owed to it is not sent. */
  forgetCredit(id: number): void {
    this.owedCredit.delete(id);
  }

  close(reason: BothyError): void {
    if (this.closed) return;
    this.closed = reason;
    this.helloWaiter?.reject(reason);
    clearTimeout(this.creditTimer);
    this.owedCredit.clear();
    for (const timer of this.deadlines.values()) clearTimeout(timer);
    this.deadlines.clear();
    for (const [, p] of this.pending) p.fail(reason);
    this.pending.clear();
    this.input.destroy();
    this.output.destroy();
    const listeners = [...this.closeListeners];
    this.closeListeners.clear();
    for (const fn of listeners) fn();
  }

  /** The channel closed under the host: closed as by `close()`, then the `onLost` listeners told. */
  lose(reason: BothyError): void {
    if (this.closed) return;
    this.close(reason);
    for (const fn of this.lostListeners) fn(reason);
  }

  /**
   * Starts (or restarts) request `id`'s deadline: if the guest has not moved it on within the
   * file timeout, the request fails with `agent_timeout` and the guest is told to drop it. The
   * channel and every other request carry on.
   */
  arm(id: number, what: string, timeoutMs = this.fileTimeoutMs): void {
    if (!this.pending.has(id)) return;
    clearTimeout(this.deadlines.get(id));
    this.deadlines.set(
      id,
      setTimeout(() => {
        const p = this.pending.get(id);
        this.settle(id);
        if (!p) return;
        this.send({ t: "cancel", id });
        p.fail(
          new BothyError(
            "agent_timeout",
            `The guest agent did not answer (${what}) within ${timeoutMs} ms; the request was abandoned, the sandbox is still usable.`,
          ),
        );
      }, timeoutMs),
    );
  }

  disarm(id: number): void {
    clearTimeout(this.deadlines.get(id));
    this.deadlines.delete(id);
  }

  /** Request `id` is over: no frame or deadline reaches it any more. */
  settle(id: number): void {
    this.pending.delete(id);
    this.disarm(id);
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
    if (p.frame(frame, payload)) return;
    if (frame.t === "error") {
      this.settle(frame.id);
      p.fail(guestError(frame.code, frame.message));
    } else if (ENDS_A_REQUEST.has(frame.t)) {
      this.settle(frame.id);
      if (frame.t === "exited" || frame.t === "tcp_closed") this.forgetCredit(frame.id);
    } else if (frame.t === "tcp_opened") {
      // The guest says this id's connection is open: whatever waits on it, it is waiting no more.
      this.disarm(frame.id);
    }
  }
}

const GUEST_FILE_ERRORS: Partial<Record<string, ErrorCode>> = {
  not_found: "file_not_found",
  exists: "file_exists",
  precondition_failed: "precondition_failed",
};

/** A guest's `error` frame as the error its request fails with. */
export function guestError(code: string, message: string): BothyError {
  return new BothyError(GUEST_FILE_ERRORS[code] ?? "file_error", message, { details: { guest_code: code } });
}
