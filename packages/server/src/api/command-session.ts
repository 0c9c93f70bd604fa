import type { WebSocket } from "ws";
import { BothyError, commandInput, commandRequest, toBothyError, type CommandEvent } from "@bothy/protocol";
import type { CommandRegistry, RunningCommand } from "../commands/command-registry.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";

/** How long a fresh socket may stay silent before it must have sent its command. */
const FIRST_MESSAGE_TIMEOUT_MS = 30_000;

export type SessionTarget = { kind: "new" } | { kind: "attach"; commandId: string };

/**
 * One WebSocket attached to one command. On `/command` the first message starts the command; on
 * `/commands/{id}` the socket re-attaches to a running or finished one, replaying what the buffer
 * kept. Later messages feed stdin or send signals. `process_exited` (or a final `error`) is
 * always the last message. Output is acknowledged to the guest only once this socket has written
 * it, so a slow client slows the command rather than growing the server's memory.
 */
export class CommandSession {
  private command: RunningCommand | undefined;
  private detach: (() => void) | undefined;
  private closed = false;
  private serverEnded = false;
  /** The socket that started a foreground command owns it; re-attached sockets only watch. */
  private readonly owner: boolean;
  private readonly outstanding = new Set<() => void>();
  private readonly firstMessageTimer: NodeJS.Timeout | undefined;

  constructor(
    private readonly socket: WebSocket,
    private readonly sandboxId: string,
    private readonly manager: SandboxManager,
    private readonly registry: CommandRegistry,
    target: SessionTarget,
  ) {
    this.owner = target.kind === "new";
    socket.on("message", (data, isBinary) => this.onMessage(data as Buffer, isBinary));
    socket.on("close", () => this.onClientGone());
    socket.on("error", () => this.onClientGone());
    if (target.kind === "attach") this.attach(target.commandId);
    else
      this.firstMessageTimer = setTimeout(
        () =>
          this.fail(
            new BothyError(
              "invalid_command",
              `Send the command as the first message within ${FIRST_MESSAGE_TIMEOUT_MS / 1000} s.`,
            ),
          ),
        FIRST_MESSAGE_TIMEOUT_MS,
      );
  }

  private onMessage(data: Buffer, isBinary: boolean): void {
    if (this.closed) return;
    let json: unknown;
    try {
      json = isBinary ? undefined : JSON.parse(data.toString("utf8"));
    } catch {
      json = undefined;
    }
    if (json === undefined)
      return this.fail(new BothyError("invalid_command", 'Messages are JSON text, e.g. {"cmd":"echo hi"}.'));
    if (!this.command) return this.start(json);
    const input = commandInput.safeParse(json);
    if (!input.success)
      return this.fail(
        new BothyError(
          "invalid_command",
          `Unexpected message while the command runs: ${summarize(input.error.issues)}. Send {"type":"stdin","data":"..."}, {"type":"stdin_eof"}, {"type":"signal","signal":"SIGINT"} or {"type":"resize","cols":80,"rows":24}.`,
        ),
      );
    const msg = input.data;
    if (msg.type === "stdin")
      this.command.stdin(Buffer.from(msg.data, msg.encoding === "base64" ? "base64" : "utf8"), false);
    else if (msg.type === "stdin_eof") this.command.stdin(Buffer.alloc(0), true);
    else if (msg.type === "resize") this.command.resize(msg.cols, msg.rows);
    else this.command.signal(msg.signal);
  }

  private start(json: unknown): void {
    clearTimeout(this.firstMessageTimer);
    const parsed = commandRequest.safeParse(json);
    if (!parsed.success)
      return this.fail(
        new BothyError(
          "invalid_command",
          `${summarize(parsed.error.issues)}. The first message is {"cmd":"<shell line>"} with optional cwd, env, timeout_s, stdin, background, pty.`,
        ),
      );
    try {
      this.command = this.registry.start(this.sandboxId, this.manager.agent(this.sandboxId), parsed.data);
    } catch (err) {
      return this.fail(toBothyError(err));
    }
    this.listen(this.command, false);
  }

  private attach(commandId: string): void {
    const live = this.registry.get(this.sandboxId, commandId);
    if (live) {
      this.command = live;
      this.listen(live, true);
      return;
    }
    // Not held in memory any more: the ledger still knows how it ended.
    try {
      const info = this.registry.info(this.sandboxId, commandId);
      if (info.state === "exited") {
        this.send({
          type: "process_exited",
          command_id: commandId,
          exit_code: info.exit_code,
          ...(info.signal ? { signal: info.signal } : {}),
          ...(info.timed_out ? { timed_out: true } : {}),
        });
        this.close(1000, "process exited");
      } else {
        this.fail(
          new BothyError(
            "agent_unavailable",
            `Command ${commandId} was lost when its sandbox stopped; its output is gone.`,
          ),
        );
      }
    } catch (err) {
      this.fail(toBothyError(err));
    }
  }

  private listen(command: RunningCommand, replay: boolean): void {
    this.detach = command.attach((event, written) => {
      this.send(event, written);
      const final = event.type === "process_exited" || (event.type === "error" && command.finished);
      if (final) this.close(1000, event.type === "error" ? event.code : "process exited");
    }, replay);
  }

  /** Ends the session with an error message; a foreground command is killed. */
  private fail(err: BothyError): void {
    if (this.closed) return;
    this.send({
      type: "error",
      code: err.code,
      message: err.message,
      ...(this.command ? { command_id: this.command.id } : {}),
    });
    this.close(err.code === "invalid_command" ? 1008 : 1011, err.code);
  }

  /** The server ended this session (the command finished, or an error): the client did not leave. */
  get endedByServer(): boolean {
    return this.serverEnded;
  }

  private close(code: number, reason: string): void {
    this.serverEnded = true;
    this.onClientGone();
    this.socket.close(code, reason);
  }

  /** A foreground command belongs to its socket: when the client goes, the command goes. */
  private onClientGone(): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.firstMessageTimer);
    this.detach?.();
    for (const written of [...this.outstanding]) written();
    this.outstanding.clear();
    const cmd = this.command;
    if (this.owner && cmd && !cmd.finished && !cmd.request.background) cmd.signal("SIGKILL");
  }

  private send(event: CommandEvent, written?: () => void): void {
    if (this.socket.readyState !== this.socket.OPEN) {
      written?.();
      return;
    }
    if (!written) {
      this.socket.send(JSON.stringify(event));
      return;
    }
    let once = false;
    const done = (): void => {
      if (once) return;
      once = true;
      this.outstanding.delete(done);
      written();
    };
    this.outstanding.add(done);
    this.socket.send(JSON.stringify(event), done);
  }
}

/** A refused message's first problem, with where it is (`env.PATH: …`). */
export function summarize(issues: ReadonlyArray<{ path: PropertyKey[]; message: string }>): string {
  const i = issues[0];
  if (!i) return "invalid message";
  return i.path.length ? `${i.path.map(String).join(".")}: ${i.message}` : i.message;
}
