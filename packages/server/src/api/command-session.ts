import type { WebSocket } from "ws";
import { BothyError, commandInput, commandRequest, toBothyError, type CommandEvent, type CommandRequest } from "@bothy/protocol";
import type { ExecHandle } from "../agent/agent-client.ts";
import type { Ledger } from "../ledger/ledger.ts";
import type { Logger, SandboxManager } from "../sandboxes/sandbox-manager.ts";
import { newCommandId } from "../util/ids.ts";
import { Utf8Chunker } from "../util/utf8-chunker.ts";

/** How long a fresh socket may stay silent before it must have sent its command. */
const FIRST_MESSAGE_TIMEOUT_MS = 30_000;

/**
 * One command over one WebSocket: the first message starts it, later messages feed stdin or send
 * signals, output is streamed as it comes, and `process_exited` (or `error`) is always last.
 * Output is acknowledged to the guest only once the socket has written it, so a slow client
 * slows the command rather than growing the server's memory.
 */
export class CommandSession {
  private exec: ExecHandle | undefined;
  private commandId: string | undefined;
  private finished = false;
  private timedOut = false;
  private timeout: NodeJS.Timeout | undefined;
  private readonly firstMessageTimer: NodeJS.Timeout;
  private readonly chunkers = { 1: new Utf8Chunker(), 2: new Utf8Chunker() };

  constructor(
    private readonly socket: WebSocket,
    private readonly sandboxId: string,
    private readonly manager: SandboxManager,
    private readonly ledger: Ledger,
    private readonly log: Logger,
  ) {
    this.firstMessageTimer = setTimeout(() => this.fail(new BothyError("invalid_command", `Send the command as the first message within ${FIRST_MESSAGE_TIMEOUT_MS / 1000} s.`)), FIRST_MESSAGE_TIMEOUT_MS);
    socket.on("message", (data, isBinary) => this.onMessage(data as Buffer, isBinary));
    socket.on("close", () => this.onClientGone());
    socket.on("error", () => this.onClientGone());
  }

  private onMessage(data: Buffer, isBinary: boolean): void {
    if (this.finished) return;
    let json: unknown;
    try {
      json = isBinary ? undefined : JSON.parse(data.toString("utf8"));
    } catch {
      json = undefined;
    }
    if (json === undefined) return this.fail(new BothyError("invalid_command", "Messages are JSON text, e.g. {\"cmd\":\"echo hi\"}."));
    if (!this.exec) return this.start(json);
    const input = commandInput.safeParse(json);
    if (!input.success) return this.fail(new BothyError("invalid_command", `Unexpected message while the command runs: ${summarize(input.error.issues)}. Send {"type":"stdin","data":"..."}, {"type":"stdin_eof"} or {"type":"signal","signal":"SIGINT"}.`));
    const msg = input.data;
    if (msg.type === "stdin") this.exec.stdin(Buffer.from(msg.data, msg.encoding === "base64" ? "base64" : "utf8"));
    else if (msg.type === "stdin_eof") this.exec.stdin(Buffer.alloc(0), true);
    else this.exec.signal(msg.signal);
  }

  private start(json: unknown): void {
    clearTimeout(this.firstMessageTimer);
    const parsed = commandRequest.safeParse(json);
    if (!parsed.success) return this.fail(new BothyError("invalid_command", `${summarize(parsed.error.issues)}. The first message is {"cmd":"<shell line>"} with optional cwd, env, timeout_s, stdin.`));
    const req: CommandRequest = parsed.data;
    let agent;
    try {
      agent = this.manager.agent(this.sandboxId);
    } catch (err) {
      return this.fail(toBothyError(err));
    }
    const commandId = newCommandId();
    this.commandId = commandId;
    this.exec = agent.exec(
      { cmd: req.cmd, cwd: req.cwd, env: req.env, stdin: req.stdin ?? false },
      {
        onStarted: (pid) => {
          this.ledger.insertCommand({ id: commandId, sandbox_id: this.sandboxId, cmd: req.cmd });
          this.log("command_started", { sandbox_id: this.sandboxId, command_id: commandId, pid });
          this.send({ type: "started", command_id: commandId, sandbox_id: this.sandboxId, pid });
        },
        onOutput: (fd, bytes, consumed) => {
          const chunk = this.chunkers[fd].push(bytes);
          if (!chunk) return consumed();
          this.send({ type: fd === 1 ? "stdout" : "stderr", command_id: commandId, ...chunk }, consumed);
        },
        onExited: (code, signal) => this.onExited(code, signal),
        onError: (err) => {
          if (err.code === "invalid_command") this.send({ type: "error", code: err.code, message: err.message, command_id: commandId });
          else this.fail(err);
        },
      },
    );
    if (req.timeout_s !== undefined) {
      this.timeout = setTimeout(() => {
        this.timedOut = true;
        this.exec?.signal("SIGKILL");
      }, req.timeout_s * 1000);
    }
  }

  private onExited(code: number | null, signal: string | null): void {
    clearTimeout(this.timeout);
    const commandId = this.commandId ?? "";
    for (const fd of [1, 2] as const) {
      const rest = this.chunkers[fd].flush();
      if (rest) this.send({ type: fd === 1 ? "stdout" : "stderr", command_id: commandId, ...rest });
    }
    if (this.ledger.getCommand(commandId)) this.ledger.finishCommand(commandId, { state: "exited", exit_code: code, signal });
    this.log("command_exited", { sandbox_id: this.sandboxId, command_id: commandId, exit_code: code, signal, timed_out: this.timedOut });
    this.send({
      type: "process_exited",
      command_id: commandId,
      exit_code: code,
      ...(signal === null ? {} : { signal }),
      ...(this.timedOut ? { timed_out: true } : {}),
    });
    this.finished = true;
    this.socket.close(1000, "process exited");
  }

  /** Ends the session with an error message; a running command is killed. */
  private fail(err: BothyError): void {
    if (this.finished) return;
    this.finished = true;
    clearTimeout(this.firstMessageTimer);
    clearTimeout(this.timeout);
    this.exec?.signal("SIGKILL");
    if (err.code === "internal") this.log("command_error", { sandbox_id: this.sandboxId, command_id: this.commandId, error: String(err.cause ?? err.message) });
    this.send({ type: "error", code: err.code, message: err.message, ...(this.commandId ? { command_id: this.commandId } : {}) });
    this.socket.close(err.code === "invalid_command" ? 1008 : 1011, err.code);
  }

  /** A foreground command belongs to its socket: when the client goes, the command goes. */
  private onClientGone(): void {
    clearTimeout(this.firstMessageTimer);
    if (this.finished) return;
    this.finished = true;
    clearTimeout(this.timeout);
    this.exec?.signal("SIGKILL");
  }

  private send(event: CommandEvent, written?: () => void): void {
    if (this.socket.readyState !== this.socket.OPEN) {
      written?.();
      return;
    }
    this.socket.send(JSON.stringify(event), () => written?.());
  }
}

function summarize(issues: ReadonlyArray<{ path: PropertyKey[]; message: string }>): string {
  const i = issues[0];
  if (!i) return "invalid message";
  return i.path.length ? `${i.path.map(String).join(".")}: ${i.message}` : i.message;
}
