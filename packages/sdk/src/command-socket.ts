/**
 * One command WebSocket: sends the command (or attaches to a running one), validates every frame
 * with the protocol's schema, and turns the stream into `started` / output / exit callbacks.
 * `process_exited` or `error` is always the last frame; a socket that closes before either
 * rejects the exit with a ConnectionError.
 */
import WebSocket from "ws";
import { commandEvent, type CommandEvent, type CommandInput, type CommandRequest } from "@bothy/protocol";
import { ConnectionError, errorFromCode, errorFromProblem, SandboxError } from "./errors.ts";
import type { HttpClient } from "./http-client.ts";

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
  private commandId: string | undefined;
  private done = false;
  private resolveStarted!: (v: { commandId: string; pid: number | undefined }) => void;
  private rejectStarted!: (err: unknown) => void;
  private resolveExited!: (v: ProcessExit) => void;
  private rejectExited!: (err: unknown) => void;

  private constructor(
    http: HttpClient,
    path: string,
    first: CommandRequest | undefined,
    private readonly listener: SocketListener,
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

    this.ws = new WebSocket(http.wsUrl(path), { headers: http.authHeaders() });
    this.ws.on("open", () => {
      if (first) this.ws.send(JSON.stringify(first));
      else {
        this.commandId = path.split("/").at(-1);
        this.resolveStarted({ commandId: this.commandId ?? "", pid: undefined });
      }
    });
    this.ws.on("unexpected-response", (_req, res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => this.fail(errorFromProblem(res.statusCode ?? 0, Buffer.concat(chunks).toString("utf8"))));
      res.on("error", (err) =>
        this.fail(
          new ConnectionError(`The command socket failed: ${err.message}`, { code: "connection_failed", cause: err }),
        ),
      );
    });
    this.ws.on("message", (data, isBinary) => this.onMessage(data as Buffer, isBinary));
    this.ws.on("error", (err) =>
      this.fail(
        new ConnectionError(
          `Cannot reach bothy at ${http.baseUrl} (${(err as NodeJS.ErrnoException).code ?? err.message}); is \`bothy serve\` running there?`,
          { code: "connection_failed", cause: err },
        ),
      ),
    );
    this.ws.on("close", (code, reason) =>
      this.fail(
        new ConnectionError(
          `The command socket closed (${code}${reason.length ? ` ${reason.toString()}` : ""}) before the command ended; re-attach with commands.connect().`,
          { code: "connection_closed" },
        ),
      ),
    );
  }

  /** Starts `request` on a new `/sandboxes/{id}/command` socket. */
  static run(http: HttpClient, sandboxId: string, request: CommandRequest, listener: SocketListener): CommandSocket {
    return new CommandSocket(http, `/sandboxes/${sandboxId}/command`, request, listener);
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
    if (this.ws.readyState === WebSocket.OPEN || this.ws.readyState === WebSocket.CONNECTING)
      this.ws.close(1000, reason);
  }

  /** Gives up on the socket with `reason` (an AbortSignal's); a foreground command is killed. */
  abort(reason: unknown): void {
    this.fail(reason);
    if (this.ws.readyState === WebSocket.CONNECTING) this.ws.terminate();
    else if (this.ws.readyState === WebSocket.OPEN) this.ws.close(1000, "aborted");
  }

  private onMessage(data: Buffer, isBinary: boolean): void {
    if (this.done) return;
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
        return;
      case "error":
        this.fail(errorFromCode(event.code, event.message));
        return;
    }
  }

  private fail(err: unknown): void {
    if (this.done) return;
    this.done = true;
    this.rejectStarted(err);
    this.rejectExited(err);
  }
}
