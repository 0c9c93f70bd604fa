/**
 * `sandbox.commands`: run a shell line and get `{exitCode, stdout, stderr}`, stream its output,
 * or start it in the background and hold a handle with separate verbs: `wait`, `kill`,
 * `disconnect`, `sendStdin`.
 */
import {
  commandInfo,
  commandList,
  commandResult,
  type CommandInfo,
  type CommandRequest,
  type SignalName,
} from "@bothy/protocol";
import { CommandSocket, type OutputStream, type ProcessExit, type SocketListener } from "./command-socket.ts";
import { CommandExitError, CommandTimeoutError, type CommandResult } from "./errors.ts";
import type { CallOptions, HttpClient } from "./http-client.ts";
import { KeptSockets } from "./kept-sockets.ts";

export type { CommandInfo, SignalName };

export interface CommandOptions extends CallOptions {
  /** Working directory inside the sandbox (default /workspace). */
  cwd?: string;
  env?: Record<string, string>;
  /** The server kills the command after this many seconds; `run` then throws a CommandTimeoutError. */
  timeoutS?: number;
  /**
   * Input for the command: a string or bytes are written and stdin is closed; `true` keeps stdin
   * open for `handle.sendStdin()` (background commands).
   */
  stdin?: string | Uint8Array | boolean;
  /** Output as text, as it arrives. */
  onStdout?: (data: string) => void;
  onStderr?: (data: string) => void;
  /** Output as the exact bytes, as it arrives (for binary output or a byte-exact relay). */
  onOutput?: (bytes: Uint8Array, stream: OutputStream) => void;
  /** Default true: a non-zero exit throws CommandExitError; false resolves with the result. */
  throwOnError?: boolean;
  /**
   * Default true: the result holds all of the output. false holds none (`stdout` and `stderr`
   * stay empty) for output only the callbacks should see, which may be larger than memory.
   */
  keepOutput?: boolean;
}

export interface RunOptions extends CommandOptions {
  background?: false;
}
export interface BackgroundOptions extends CommandOptions {
  background: true;
}

/** Options of `commands.exec`: what a command run in one HTTP request can take. */
export interface ExecOptions extends CallOptions {
  cwd?: string;
  env?: Record<string, string>;
  /** The server kills the command after this many seconds; `exec` then throws a CommandTimeoutError. */
  timeoutS?: number;
  /** Default true: a non-zero exit throws CommandExitError; false resolves with the result. */
  throwOnError?: boolean;
}

/** What `exec` answers: `truncated` when a stream passed the server's 16 MiB cap and the rest was dropped. */
export interface ExecResult extends CommandResult {
  truncated: boolean;
}

export interface ConnectOptions extends CallOptions {
  onStdout?: (data: string) => void;
  onStderr?: (data: string) => void;
  onOutput?: (bytes: Uint8Array, stream: OutputStream) => void;
  throwOnError?: boolean;
  keepOutput?: boolean;
}

/** A running (or finished) command. */
export class CommandHandle {
  private readonly out: Record<OutputStream, Buffer[]> = { stdout: [], stderr: [] };
  private readonly decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
  private socket!: CommandSocket;
  private exit: ProcessExit | undefined;
  /** Bytes of older output the server had already dropped when this handle attached. */
  droppedBytes = 0;

  /** @internal use `sandbox.commands.run(..., {background: true})` or `commands.connect(id)`. */
  constructor(
    readonly commandId: string,
    /** The process id inside the sandbox; undefined for a re-attached command. */
    readonly pid: number | undefined,
    private readonly options: ConnectOptions,
  ) {}

  /** @internal */
  static async open(
    start: (listener: SocketListener) => CommandSocket,
    options: ConnectOptions,
  ): Promise<CommandHandle> {
    // Output (and a replay's output_dropped) can arrive before `started` is awaited: hold it.
    const early: { output: Array<[OutputStream, Uint8Array]>; dropped: number; handle: CommandHandle | undefined } = {
      output: [],
      dropped: 0,
      handle: undefined,
    };
    const socket = start({
      onOutput: (stream, bytes) =>
        early.handle ? early.handle.onOutput(stream, bytes) : early.output.push([stream, bytes]),
      onDropped: (bytes) => {
        if (early.handle) early.handle.droppedBytes += bytes;
        else early.dropped += bytes;
      },
    });
    const { commandId, pid } = await raceAbort(socket.started, options.signal, (reason) => socket.abort(reason));
    const handle = new CommandHandle(commandId, pid, options);
    handle.socket = socket;
    handle.droppedBytes = early.dropped;
    socket.exited.then(
      (exit) => (handle.exit = exit),
      () => undefined,
    );
    for (const [stream, bytes] of early.output) handle.onOutput(stream, bytes);
    early.handle = handle;
    return handle;
  }

  get stdout(): string {
    return Buffer.concat(this.out.stdout).toString("utf8");
  }

  get stderr(): string {
    return Buffer.concat(this.out.stderr).toString("utf8");
  }

  /** The exit code once it has exited (null when a signal ended it); undefined while it runs. */
  get exitCode(): number | null | undefined {
    return this.exit?.exit_code;
  }

  /**
   * Waits for the command to end. Throws CommandExitError on a non-zero exit (unless
   * `throwOnError: false`), CommandTimeoutError when its `timeoutS` ran out. Aborting the signal lets go
   * of the socket: a background command keeps running, a foreground one is killed.
   */
  async wait(options: CallOptions = {}): Promise<CommandResult> {
    const exit = await raceAbort(this.socket.exited, options.signal, (reason) => this.socket.abort(reason));
    const result: CommandResult = {
      commandId: this.commandId,
      exitCode: exit.exit_code,
      ...(exit.signal === undefined ? {} : { signal: exit.signal }),
      stdout: this.stdout,
      stderr: this.stderr,
    };
    if (exit.timed_out) throw new CommandTimeoutError(result);
    if (this.options.throwOnError !== false && exit.exit_code !== 0) throw new CommandExitError(result);
    return result;
  }

  /** Sends a signal (default SIGKILL) to the command's process group; false when it had already ended. */
  async kill(signal: SignalName = "SIGKILL"): Promise<boolean> {
    if (this.socket.finished) return false;
    this.socket.send({ type: "signal", signal });
    return true;
  }

  sendStdin(data: string | Uint8Array): void {
    if (typeof data === "string") this.socket.send({ type: "stdin", data });
    else this.socket.send({ type: "stdin", data: Buffer.from(data).toString("base64"), encoding: "base64" });
  }

  closeStdin(): void {
    this.socket.send({ type: "stdin_eof" });
  }

  /** Resizes the terminal of a PTY command (`sandbox.pty.create`). */
  resize(size: { cols: number; rows: number }): void {
    this.socket.send({ type: "resize", cols: size.cols, rows: size.rows });
  }

  /**
   * Stops receiving output and lets go of the socket cleanly. A background command keeps running
   * (re-attach with `commands.connect(commandId)`); a foreground one is killed by the server.
   */
  disconnect(): void {
    if (!this.socket.finished) this.socket.close();
  }

  private onOutput(stream: OutputStream, bytes: Uint8Array): void {
    if (this.options.keepOutput !== false) this.out[stream].push(Buffer.from(bytes));
    this.options.onOutput?.(bytes, stream);
    const cb = stream === "stdout" ? this.options.onStdout : this.options.onStderr;
    if (cb) {
      const text = this.decoders[stream].decode(bytes, { stream: true });
      if (text) cb(text);
    }
  }
}

export class Commands {
  /** Sockets kept open for the next foreground command (one command at a time on each). */
  private readonly kept = new KeptSockets();

  /** @internal */
  constructor(
    private readonly http: HttpClient,
    private readonly sandboxId: string,
  ) {}

  /** @internal Closes the kept command sockets (the sandbox is being deleted). */
  closeKept(): void {
    this.kept.close();
  }

  /** Runs `cmd` under /bin/sh -c and resolves when it exits; or, with `background: true`, once it has started. */
  run(cmd: string, options: BackgroundOptions): Promise<CommandHandle>;
  run(cmd: string, options?: RunOptions): Promise<CommandResult>;
  async run(cmd: string, options: RunOptions | BackgroundOptions = {}): Promise<CommandResult | CommandHandle> {
    const handle = await this.start(cmd, options, {});
    if (options.background) return handle;
    return handle.wait(options.signal ? { signal: options.signal } : {});
  }

  /**
   * Runs `cmd` to its end in one HTTP request (no WebSocket; the connection is kept alive for the
   * next call): the quickest way to run a short command. No stdin, streaming or background: use
   * `run` for those, and for output past 16 MiB a stream, which `exec` drops (`truncated`).
   * Aborting the signal ends the request, and the server kills the command.
   */
  async exec(cmd: string, options: ExecOptions = {}): Promise<ExecResult> {
    const request: CommandRequest = {
      cmd,
      ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
      ...(options.env === undefined ? {} : { env: options.env }),
      ...(options.timeoutS === undefined ? {} : { timeout_s: options.timeoutS }),
    };
    // The command's own timeout_s is its deadline, not the client's per-request one.
    const answer = await this.http.json("POST", `/sandboxes/${this.sandboxId}/commands`, commandResult, {
      body: request,
      timeout: false,
      ...(options.signal ? { signal: options.signal } : {}),
    });
    const text = (data: string, encoding: "base64" | undefined): string =>
      encoding === "base64" ? Buffer.from(data, "base64").toString("utf8") : data;
    const result: ExecResult = {
      commandId: answer.command_id,
      exitCode: answer.exit_code,
      ...(answer.signal === undefined ? {} : { signal: answer.signal }),
      stdout: text(answer.stdout, answer.stdout_encoding),
      stderr: text(answer.stderr, answer.stderr_encoding),
      truncated: answer.truncated ?? false,
    };
    if (answer.timed_out) throw new CommandTimeoutError(result);
    if (options.throwOnError !== false && answer.exit_code !== 0) throw new CommandExitError(result);
    return result;
  }

  /**
   * Starts a command and answers its handle at once, without waiting for it to end. Unless
   * `background: true`, the command belongs to the handle: it is killed when the handle
   * disconnects. `extra` adds raw request fields (the PTY size).
   */
  async start(
    cmd: string,
    options: CommandOptions & { background?: boolean } = {},
    extra: Partial<CommandRequest> = {},
  ): Promise<CommandHandle> {
    const request: CommandRequest = {
      cmd,
      ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
      ...(options.env === undefined ? {} : { env: options.env }),
      ...(options.timeoutS === undefined ? {} : { timeout_s: options.timeoutS }),
      ...(options.stdin === undefined || options.stdin === false ? {} : { stdin: true }),
      ...(options.background ? { background: true } : {}),
      ...extra,
    };
    // A foreground command runs on a kept socket; a background one outlives its socket, so it
    // gets one of its own (its handle may disconnect, and a re-attach opens another).
    const kept = options.background ? undefined : this.kept;
    const handle = await CommandHandle.open(
      (listener) => CommandSocket.run(this.http, this.sandboxId, request, listener, kept),
      options,
    );
    const input = options.stdin;
    if (typeof input === "string" || input instanceof Uint8Array) {
      if (input.length > 0) handle.sendStdin(input);
      handle.closeStdin();
    }
    return handle;
  }

  /** Re-attaches to a command: replays what the server kept of its output, then streams it live. */
  async connect(commandId: string, options: ConnectOptions = {}): Promise<CommandHandle> {
    return CommandHandle.open(
      (listener) => CommandSocket.attach(this.http, this.sandboxId, commandId, listener),
      options,
    );
  }

  /** The sandbox's commands (running ones and recent finished ones) with their state. */
  async list(options: CallOptions = {}): Promise<CommandInfo[]> {
    return (await this.http.json("GET", `/sandboxes/${this.sandboxId}/commands`, commandList, options)).commands;
  }

  /**
   * Sends `processSignal` (default SIGKILL) to a command by id, e.g. a background one started
   * elsewhere, and waits for it to end. Answers false when it had already ended.
   */
  async kill(commandId: string, processSignal: SignalName = "SIGKILL", options: CallOptions = {}): Promise<boolean> {
    const info = await this.http.json(
      "GET",
      `/sandboxes/${this.sandboxId}/commands/${commandId}`,
      commandInfo,
      options,
    );
    if (info.state !== "running") return false;
    const handle = await this.connect(commandId, { ...options, throwOnError: false });
    try {
      if (!(await handle.kill(processSignal))) return false;
      await handle.wait(options).catch((err: unknown) => {
        if (options.signal?.aborted) throw err;
      });
      return true;
    } finally {
      handle.disconnect();
    }
  }
}

/** Waits for `promise` unless `signal` aborts first; on abort, runs `onAbort` and rejects with the reason. */
export function raceAbort<T>(
  promise: Promise<T>,
  signal: AbortSignal | undefined,
  onAbort: (reason: unknown) => void,
): Promise<T> {
  if (!signal) return promise;
  if (signal.aborted) {
    onAbort(signal.reason);
    return Promise.reject(signal.reason);
  }
  return new Promise<T>((resolve, reject) => {
    const abort = (): void => {
      onAbort(signal.reason);
      reject(signal.reason);
    };
    signal.addEventListener("abort", abort, { once: true });
    promise.then(
      (v) => {
        signal.removeEventListener("abort", abort);
        resolve(v);
      },
      (err: unknown) => {
        signal.removeEventListener("abort", abort);
        reject(err);
      },
    );
  });
}
