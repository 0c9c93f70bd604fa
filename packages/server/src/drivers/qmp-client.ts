import { connect, type Socket } from "node:net";
import { BothyError } from "@bothy/protocol";
import { z } from "zod";

/** Every QMP message is one JSON object per line: a greeting, a reply to an id, or an event. */
const qmpMessage = z.union([
  z.object({ QMP: z.object({}).passthrough() }),
  z.object({ return: z.unknown(), id: z.number().optional() }),
  z.object({ error: z.object({ class: z.string(), desc: z.string() }), id: z.number().optional() }),
  z.object({ event: z.string(), data: z.unknown().optional() }),
]);

const COMMAND_TIMEOUT_MS = 30_000;

interface Pending {
  resolve: (value: unknown) => void;
  reject: (err: Error) => void;
  timer: NodeJS.Timeout;
}

/**
 * A client of QEMU's machine protocol on a unix socket: negotiates capabilities, matches replies
 * to requests by id, times each out, and rejects everything pending when the socket closes.
 */
export class QmpClient {
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private buffer = "";
  private closed: Error | undefined;
  private readonly eventListeners = new Set<(event: string, data: unknown) => void>();

  private constructor(private readonly socket: Socket) {
    socket.setEncoding("utf8");
    socket.on("data", (s: string) => this.onData(s));
    socket.on("close", () => this.fail(new Error("the QMP socket closed")));
    socket.on("error", (err) => this.fail(err));
  }

  /** Connects, waits for the greeting and enters command mode. */
  static async connect(path: string, signal?: AbortSignal): Promise<QmpClient> {
    const socket = connect(path);
    await new Promise<void>((resolve, reject) => {
      socket.once("connect", resolve);
      socket.once("error", reject);
      signal?.addEventListener("abort", () => reject(new Error("aborted")), { once: true });
    });
    return QmpClient.over(socket);
  }

  /** Enters command mode on an already connected socket. */
  static async over(socket: Socket): Promise<QmpClient> {
    const client = new QmpClient(socket);
    await client.command("qmp_capabilities");
    return client;
  }

  onEvent(fn: (event: string, data: unknown) => void): () => void {
    this.eventListeners.add(fn);
    return () => this.eventListeners.delete(fn);
  }

  command(execute: string, args?: Record<string, unknown>, timeoutMs = COMMAND_TIMEOUT_MS): Promise<unknown> {
    if (this.closed) return Promise.reject(this.closed);
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new BothyError("internal", `QMP ${execute} got no answer within ${timeoutMs} ms.`));
      }, timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      this.socket.write(`${JSON.stringify({ execute, ...(args ? { arguments: args } : {}), id })}\n`);
    });
  }

  close(): void {
    this.fail(new Error("the QMP client was closed"));
  }

  private onData(s: string): void {
    this.buffer += s;
    let nl: number;
    while ((nl = this.buffer.indexOf("\n")) >= 0) {
      const line = this.buffer.slice(0, nl).trim();
      this.buffer = this.buffer.slice(nl + 1);
      if (line === "") continue;
      let parsed;
      try {
        parsed = qmpMessage.safeParse(JSON.parse(line));
      } catch {
        parsed = undefined;
      }
      if (!parsed?.success) continue; // QEMU speaks; an unknown shape is not ours to act on
      const msg = parsed.data;
      if ("event" in msg) {
        for (const fn of this.eventListeners) fn(msg.event, msg.data);
        continue;
      }
      if ("QMP" in msg) {
        // The greeting arrives first; the capabilities command is already queued behind it.
        continue;
      }
      const p = msg.id === undefined ? undefined : this.pending.get(msg.id);
      if (!p || msg.id === undefined) continue;
      this.pending.delete(msg.id);
      clearTimeout(p.timer);
      if ("error" in msg) p.reject(new Error(`QMP error ${msg.error.class}: ${msg.error.desc}`));
      else p.resolve(msg.return);
    }
  }

  private fail(err: Error): void {
    if (this.closed) return;
    this.closed = err;
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(err);
    }
    this.pending.clear();
    this.socket.destroy();
  }
}
