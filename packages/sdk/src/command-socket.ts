/**
 * One command on a WebSocket: sends the command (or attaches to a running one), validates every
 * frame with the protocol's schema, and turns the stream into `started` / output / exit callbacks.
 * `process_exited` or `error` is always the last frame of a command; a socket that closes before
 * either rejects the exit with a ConnectionError. A foreground command may run on a kept socket
 * (`?keep=true`, from `KeptSockets`), which goes back to its pool once the server is between
 * commands: at `process_exited`, or at `ready` after an `error`. Only a socket the server said
 * `ready` on (at open) goes back: a server without kept sockets closes it after one command.
 */
import type { IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import WebSocket from "ws";
import { commandEvent, type CommandEvent, type CommandInput, type CommandRequest } from "@bothy/protocol";
import { ConnectionError, errorFromCode, errorFromProblem, SandboxError } from "./errors.ts";
import type { HttpClient } from "./http-client.ts";
import type { KeptSockets } from "./kept-sockets.ts";

export type OutputStream = "stdout" | "stderr";
export type ProcessExit = Extract<CommandEvent, { type: "process_exited" }>;

export interface SocketListener {
  onOutput(stream: OutputStream, bytes: Uint8Array): void;
  onDropped?(bytes: number): void;
}

export class CommandSocket {
  /** Resolves on `started` (new commands) or at once on open (re-attach, which has no `started`). */
  readonly started: Promise<{ commandId: string; pid: number | undefined }>;
  readonly exited: Promise<ProcessExit>;
  private readonly ws: WebSocket;
  /** The TCP socket under a kept WebSocket, unref'd while the socket idles in its pool. */
  private tcp: Socket | undefined;
  private commandId: string | undefined;
  private done = false;
  /** This command is over and the socket left for its pool or closed: no frame is read any more. */
  private letGo = false;
  /** The server keeps this socket: it said `ready` (at open, or it came from the pool). */
  private keptByServer: boolean;
  private readonly handlers: Array<[string, (...args: never[]) => void]> = [];
  private resolveStarted!: (v: { commandId: string; pid: number | undefined }) => void;
  private rejectStarted!: (err: unknown) => void;
  private resolveExited!: (v: ProcessExit) => void;
  private rejectExited!: (err: unknown) => void;

  private constructor(
    http: HttpClient,
    path: string,
    first: CommandRequest | undefined,
    private readonly listener: SocketListener,
    private readonly kept?: KeptSockets,
  ) {
    this.started = new Promise((resolve, reject) => {
      this.resolveStarted = resolve;
      this.rejectStarted = reject;
    });
    this.exited = new Promise((resolve, reject) => {
      this.resolveExited = resolve;
      this.rejectExited = reject;
    });
    // A caller that only awaits one of the two must not see the other as unhandled.
    this.started.catch(() => undefined);
    this.exited.catch(() => undefined);

    const reused = kept?.take();
    this.ws =
      reused?.ws ?? new WebSocket(http.wsUrl(kept ? `${path}?keep=true` : path), { headers: http.authHeaders() });
    this.tcp = reused?.tcp;
    this.keptByServer = reused !== undefined;
    const on = (event: string, handler: (...args: never[]) => void): void => {
      this.handlers.push([event, handler]);
      this.ws.on(event, handler as (...args: unknown[]) => void);
    };
    if (reused && first) this.ws.send(JSON.stringify(first));
    on("upgrade", (res: IncomingMessage) => (this.tcp = res.socket));
    on("open", () => {
      if (first) this.ws.send(JSON.stringify(first));
      else {
        this.commandId = path.split("/").at(-1);
        this.resolveStarted({ commandId: this.commandId ?? "", pid: undefined });
      }
    });
    on("unexpected-response", (_req: unknown, res: IncomingMessage) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => this.fail(errorFromProblem(res.statusCode ?? 0, Buffer.concat(chunks).toString("utf8"))));
      res.on("error", (err) =>
        this.fail(
          new ConnectionError(`The command socket failed: ${err.message}`, { code: "connection_failed", cause: err }),
        ),
      );
    });
    on("message", (data: Buffer, isBinary: boolean) => this.onMessage(data, isBinary));
    on("error", (err: Error) =>
      this.fail(
        new ConnectionError(
          `Cannot reach bothy at ${http.baseUrl} (${(err as NodeJS.ErrnoException).code ?? err.message}); is \`bothy serve\` running there?`,
          { code: "connection_failed", cause: err },
        ),
      ),
    );
    on("close", (code: number, reason: Buffer) =>
      this.fail(
        new ConnectionError(
          `The command socket closed (${code}${reason.length ? ` ${reason.toString()}` : ""}) before the command ended; re-attach with commands.connect().`,
          { code: "connection_closed" },
        ),
      ),
    );
  }

  /** Starts `request` on a new `/sandboxes/{id}/command` socket, or on a kept one from `kept`. */
  static run(
    http: HttpClient,
    sandboxId: string,
    request: CommandRequest,
    listener: SocketListener,
    kept?: KeptSockets,
  ): CommandSocket {
    return new CommandSocket(http, `/sandboxes/${sandboxId}/command`, request, listener, kept);
  }

  /** Re-attaches to command `commandId`: replays its buffered output, then streams it live. */
  static attach(http: HttpClient, sandboxId: string, commandId: string, listener: SocketListener): CommandSocket {
    return new CommandSocket(http, `/sandboxes/${sandboxId}/commands/${commandId}`, undefined, listener);
  }

  get finished(): boolean {
    return this.done;
  }

  send(input: CommandInput): void {
    if (this.done || this.ws.readyState !== WebSocket.OPEN)
      throw new SandboxError(`Command ${this.commandId ?? ""} is no longer attached; nothing was sent.`, {
        code: "not_attached",
      });
    this.ws.send(JSON.stringify(input));
  }

  /** Closes cleanly (1000): a background command keeps running, a foreground one is killed. */
  close(reason = "client disconnected"): void {
    this.fail(
      new SandboxError(
        `Disconnected from command ${this.commandId ?? ""}; it keeps running if it is a background command.`,
        { code: "disconnected" },
      ),
    );
    // Given back to its pool, the socket is no longer this command's to close.
    if (this.letGo) return;
    if (this.ws.readyState === WebSocket.OPEN || this.ws.readyState === WebSocket.CONNECTING)
      this.ws.close(1000, reason);
  }

  /** Gives up on the socket with `reason` (an AbortSignal's); a foreground command is killed. */
  abort(reason: unknown): void {
    this.fail(reason);
    if (this.letGo) return;
    if (this.ws.readyState === WebSocket.CONNECTING) this.ws.terminate();
    else if (this.ws.readyState === WebSocket.OPEN) this.ws.close(1000, "aborted");
  }

  private onMessage(data: Buffer, isBinary: boolean): void {
    // A one-shot socket reads nothing after its command's end; a kept one reads on to its `ready`.
    if (this.letGo || (this.done && !this.kept)) return;
    let event: CommandEvent;
    try {
      const parsed = commandEvent.safeParse(isBinary ? undefined : JSON.parse(data.toString("utf8")));
      if (!parsed.success) throw parsed.error;
      event = parsed.data;
    } catch (err) {
      this.fail(
        new SandboxError(
          "The server sent a command frame this SDK does not understand; the server may be newer than the SDK.",
          { code: "bad_response", cause: err },
        ),
      );
      this.ws.close(1000);
      return;
    }
    // After an `error`, a kept socket waits for `ready`; a command that ended reads nothing more.
    if (this.done) {
      if (event.type === "ready") this.release();
      return;
    }
    switch (event.type) {
      case "started":
        this.commandId = event.command_id;
        this.resolveStarted({ commandId: event.command_id, pid: event.pid });
        return;
      case "stdout":
      case "stderr":
        this.listener.onOutput(event.type, Buffer.from(event.data, event.encoding === "base64" ? "base64" : "utf8"));
        return;
      case "output_dropped":
        this.listener.onDropped?.(event.bytes);
        return;
      case "process_exited":
        this.done = true;
        this.resolveStarted({ commandId: event.command_id, pid: undefined });
        this.resolveExited(event);
        // The server is between commands already: the next may go at once (its `ready` follows).
        // A server that did not say `ready` at open keeps no socket: it closes this one.
        if (this.keptByServer) this.release();
        return;
      case "error":
        this.fail(errorFromCode(event.code, event.message));
        return;
      case "ready":
        // A kept socket's first frame, or the `ready` after the command before this one.
        this.keptByServer = true;
        return;
    }
  }

  /** Gives a kept socket back to its pool; a one-shot socket is left for the server to close. */
  private release(): void {
    if (!this.kept || this.letGo) return;
    this.letGo = true;
    for (const [event, handler] of this.handlers) this.ws.off(event, handler as (...args: unknown[]) => void);
    this.kept.release(this.ws, this.tcp);
  }

  private fail(err: unknown): void {
    if (this.done) return;
    this.done = true;
    this.rejectStarted(err);
    this.rejectExited(err);
  }
}
