import type { WebSocket } from "ws";
import {
  BothyError,
  commandInput,
  commandRequest,
  toBothyError,
  type CommandEvent,
  type CommandInfo,
  type CommandRequest,
} from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";
import type { CommandRegistry, RunningCommand } from "../commands/command-registry.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";

/** How long a fresh socket may stay silent before it must have sent its command. */
const FIRST_MESSAGE_TIMEOUT_MS = 30_000;
/** How long a kept socket may wait between commands before the server closes it (1000 "idle"). */
export const KEPT_IDLE_TIMEOUT_MS = 60_000;

/** What a kept socket tells its route: when it waits between commands, and when it has closed. */
export interface KeptHooks {
  idle(between: boolean): void;
  closed(): void;
}

export type SessionTarget = { kind: "new"; keep?: KeptHooks } | { kind: "attach"; commandId: string };

/**
 * One WebSocket attached to one command. On `/command` the first message starts the command; on
 * `/commands/{id}` the socket re-attaches to a running or finished one, replaying what the buffer
 * kept. Later messages feed stdin or send signals. `process_exited` (or a final `error`) is
 * always the last message of a command. Output is acknowledged to the guest only once this socket
 * has written it, so a slow client slows the command rather than growing the server's memory.
 *
 * A kept socket (`/command?keep=true`) runs commands one after another: after a command's last
 * message it stays open, and the next JSON message starts the next command (waking the sandbox
 * first if it went to sleep). Input that arrives for a command that has just ended is dropped; a
 * message that is neither is a protocol violation (1008), as on a one-shot socket. It closes when
 * the client closes it, after KEPT_IDLE_TIMEOUT_MS between commands (1000 "idle"), or when its
 * sandbox is deleted (an `error` then 1001).
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
  private readonly keep: KeptHooks | undefined;
  /** A kept socket: a command has ended on it, so input for that command may still come in. */
  private ran = false;
  private idleTimer: NodeJS.Timeout | undefined;
  /** A kept socket's sandbox is waking for the next command: messages wait here until it runs. */
  private waking: Array<[Buffer, boolean]> | undefined;
  /** The sandbox was deleted while a command ran: the socket closes after its end. */
  private sandboxDeleted = false;

  constructor(
    private readonly socket: WebSocket,
    private readonly sandboxId: string,
    private readonly manager: SandboxManager,
    private readonly registry: CommandRegistry,
    target: SessionTarget,
  ) {
    this.owner = target.kind === "new";
    this.keep = target.kind === "new" ? target.keep : undefined;
    socket.on("message", (data, isBinary) => this.onMessage(data as Buffer, isBinary));
    socket.on("close", () => this.onClientGone());
    socket.on("error", () => this.onClientGone());
    if (target.kind === "attach") this.attach(target.commandId);
    else {
      // A kept socket says it takes commands at once: a client then knows this server keeps it.
      if (this.keep) this.send({ type: "ready" });
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
  }

  private onMessage(data: Buffer, isBinary: boolean): void {
    if (this.closed) return;
    if (this.waking) {
      this.waking.push([data, isBinary]);
      return;
    }
    let json: unknown;
    try {
      json = isBinary ? undefined : JSON.parse(data.toString("utf8"));
    } catch {
      json = undefined;
    }
    if (json === undefined)
      return this.fail(new BothyError("invalid_command", 'Messages are JSON text, e.g. {"cmd":"echo hi"}.'));
    if (!this.command) {
      // Late input (stdin, a signal) for the command that has just ended on a kept socket.
      if (this.ran && commandInput.safeParse(json).success) return;
      return this.start(json);
    }
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
    clearTimeout(this.idleTimer);
    const parsed = commandRequest.safeParse(json);
    if (!parsed.success)
      return this.fail(
        new BothyError(
          "invalid_command",
          `${summarize(parsed.error.issues)}. ${this.ran ? "Between commands, send the next command" : "The first message is"} {"cmd":"<shell line>"} with optional cwd, env, timeout_s, stdin, background, pty.`,
        ),
      );
    if (!this.keep) return this.run(parsed.data);
    this.keep.idle(false);
    // The socket's upgrade woke the sandbox for its first command; a later one may find it asleep.
    if (this.manager.heldAgent(this.sandboxId)) return this.run(parsed.data);
    this.hold(
      this.manager.ensureRunning(this.sandboxId).then(
        () => () => this.run(parsed.data),
        (err: unknown) => () => this.refuse(toBothyError(err)),
      ),
    );
  }

  /**
   * Holds the socket's messages until `next` settles, then runs the step it gives and replays
   * them in order: a command's stdin sent right behind it waits for the command.
   */
  private hold(next: Promise<() => void>): void {
    this.waking = [];
    this.socket.pause();
    void next.then((step) => {
      const queued = this.waking ?? [];
      this.waking = undefined;
      if (this.closed) return;
      this.socket.resume();
      step();
      for (const [data, isBinary] of queued) this.onMessage(data, isBinary);
    });
  }

  private run(request: CommandRequest): void {
    const agent = this.manager.heldAgent(this.sandboxId);
    if (agent) return this.startOn(agent, request);
    // Not running in this process: `agent` answers why (unknown, asleep, …) from the ledger.
    this.hold(
      this.manager.agent(this.sandboxId).then(
        (found) => () => this.startOn(found, request),
        (err: unknown) => () => this.cannotStart(toBothyError(err)),
      ),
    );
  }

  private startOn(agent: AgentClient, request: CommandRequest): void {
    try {
      this.command = this.registry.start(this.sandboxId, agent, request);
    } catch (err) {
      return this.cannotStart(toBothyError(err));
    }
    this.listen(this.command, false);
  }

  private cannotStart(err: BothyError): void {
    return this.keep ? this.refuse(err) : this.fail(err);
  }

  /** A kept socket's command could not start: it gets its `error`, and the socket waits for the next. */
  private refuse(err: BothyError): void {
    this.send({ type: "error", code: err.code, message: err.message });
    this.between();
  }

  /** A kept socket after a command's last message: ready for the next one. */
  private between(): void {
    this.command = undefined;
    this.detach = undefined;
    this.ran = true;
    if (this.sandboxDeleted) return this.deleted();
    this.send({ type: "ready" });
    this.keep?.idle(true);
    this.idleTimer = setTimeout(() => this.close(1000, "idle"), KEPT_IDLE_TIMEOUT_MS);
  }

  /** The sandbox was deleted: an idle kept socket says so and closes; a running command ends first. */
  sandboxGone(): void {
    this.sandboxDeleted = true;
    if (this.closed || this.command || this.waking) return;
    this.deleted();
  }

  private deleted(): void {
    this.send({
      type: "error",
      code: "sandbox_not_running",
      message: `Sandbox ${this.sandboxId} was deleted; this socket takes no more commands.`,
    });
    this.close(1001, "sandbox deleted");
  }

  private attach(commandId: string): void {
    const live = this.registry.get(this.sandboxId, commandId);
    if (live) {
      this.command = live;
      this.listen(live, true);
      return;
    }
    // Not held in memory any more: the ledger still knows how it ended (messages wait meanwhile).
    this.hold(
      this.registry.info(this.sandboxId, commandId).then(
        (info) => () => this.attachEnded(commandId, info),
        (err: unknown) => () => this.fail(toBothyError(err)),
      ),
    );
  }

  private attachEnded(commandId: string, info: CommandInfo): void {
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
  }

  private listen(command: RunningCommand, replay: boolean): void {
    this.detach = command.attach((event, written) => {
      this.send(event, written);
      const final = event.type === "process_exited" || (event.type === "error" && command.finished);
      if (!final) return;
      if (this.keep && !this.closed) this.between();
      else this.close(1000, event.type === "error" ? event.code : "process exited");
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
    clearTimeout(this.idleTimer);
    this.keep?.closed();
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
