import { BothyError, type CommandEvent, type CommandInfo, type CommandRequest, type SignalName } from "@bothy/protocol";
import type { AgentClient, ExecHandle } from "../agent/agent-client.ts";
import type { CommandRow } from "../ledger/ledger.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { newCommandId } from "../util/ids.ts";
import { Utf8Chunker } from "../util/utf8-chunker.ts";
import { ReplayBuffer } from "./replay-buffer.ts";
import type { Logger } from "../events/server-events.ts";

/** Receives a command's events; calls `written` once the event has left (for flow control). */
export type CommandListener = (event: CommandEvent, written: () => void) => void;

export interface RegistryOptions {
  replayBytes: number;
  /** Finished commands kept in memory per sandbox for late re-attach. */
  keepFinished: number;
  onExited: (info: CommandInfo) => void;
  log: Logger;
}

/**
 * One command's life on the host: its output goes to every attached listener and into a bounded
 * replay buffer. The guest is credited once every listener has written a chunk, or at once when
 * none is attached, so a background command never stalls for want of a reader.
 */
export class RunningCommand {
  private readonly listeners = new Set<CommandListener>();
  private readonly buffer: ReplayBuffer;
  private readonly chunkers = { 1: new Utf8Chunker(), 2: new Utf8Chunker() };
  private exec: ExecHandle | undefined;
  private final: CommandEvent | undefined;
  private timer: NodeJS.Timeout | undefined;
  private timedOut = false;
  /**
   * The command's record: its insert once it started, then its end's update. Each write waits for
   * the one before (a store with a pool of connections would otherwise let the update overtake
   * the insert); reads of the record wait for it.
   */
  record: Promise<CommandRow | undefined> | undefined;

  constructor(
    readonly id: string,
    readonly sandboxId: string,
    readonly request: CommandRequest,
    replayBytes: number,
    private readonly onFinal: (cmd: RunningCommand, event: CommandEvent) => void,
  ) {
    this.buffer = new ReplayBuffer(replayBytes);
  }

  get finished(): boolean {
    return this.final !== undefined;
  }

  start(agent: AgentClient, ledger: LedgerStore, log: RegistryOptions["log"]): void {
    const req = this.request;
    const asked = performance.now();
    this.exec = agent.exec(
      {
        cmd: req.cmd,
        cwd: req.cwd,
        env: req.env,
        stdin: req.stdin ?? false,
        pty: req.pty === true ? { cols: 80, rows: 24 } : req.pty,
      },
      {
        onStarted: (pid) => {
          // The record is written before any client learns the command's id (a read of it waits
          // for the write, `record`); the log line follows it.
          this.record = ledger
            .insertCommand({ id: this.id, sandbox_id: this.sandboxId, cmd: req.cmd, background: req.background })
            .then(() => undefined);
          this.emit({ type: "started", command_id: this.id, sandbox_id: this.sandboxId, pid });
          log("command_started", {
            sandbox_id: this.sandboxId,
            command_id: this.id,
            pid,
            background: req.background ?? false,
            ms: performance.now() - asked,
          });
        },
        onOutput: (fd, bytes, consumed) => {
          const chunk = this.chunkers[fd].push(bytes);
          if (!chunk) return consumed();
          this.output({ type: fd === 1 ? "stdout" : "stderr", command_id: this.id, ...chunk }, consumed);
        },
        onExited: (code, signal, oomKilled) => {
          clearTimeout(this.timer);
          for (const fd of [1, 2] as const) {
            const rest = this.chunkers[fd].flush();
            if (rest)
              this.output({ type: fd === 1 ? "stdout" : "stderr", command_id: this.id, ...rest }, () => undefined);
          }
          this.finish({
            type: "process_exited",
            command_id: this.id,
            exit_code: code,
            ...(signal === null ? {} : { signal }),
            ...(this.timedOut ? { timed_out: true } : {}),
            ...(oomKilled ? { oom_killed: true } : {}),
          });
        },
        onError: (err) => {
          // A command that cannot start still ends with its own `exited` frame.
          if (err.code === "invalid_command")
            this.emit({ type: "error", code: err.code, message: err.message, command_id: this.id });
          else
            this.finish({
              type: "error",
              code: err.code,
              message: lostMessage(err, this.sandboxId),
              command_id: this.id,
            });
        },
      },
    );
    if (req.timeout_s !== undefined) {
      this.timer = setTimeout(() => {
        this.timedOut = true;
        this.signal("SIGKILL");
      }, req.timeout_s * 1000);
    }
  }

  get wasTimedOut(): boolean {
    return this.timedOut;
  }

  /** Adds a listener; with `replay`, it first gets the buffered output (and the end, if over). */
  attach(listener: CommandListener, replay: boolean): () => void {
    if (replay) for (const ev of this.buffer.replay(this.id)) listener(ev, () => undefined);
    if (this.final) {
      listener(this.final, () => undefined);
      return () => undefined;
    }
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  signal(signal: SignalName): void {
    if (!this.final) this.exec?.signal(signal);
  }

  stdin(data: Buffer, eof: boolean): void {
    if (!this.final) this.exec?.stdin(data, eof);
  }

  resize(cols: number, rows: number): void {
    if (!this.final) this.exec?.resize(cols, rows);
  }

  private output(event: Extract<CommandEvent, { type: "stdout" | "stderr" }>, consumed: () => void): void {
    this.buffer.push(event);
    this.emit(event, consumed);
  }

  private emit(event: CommandEvent, consumed: () => void = () => undefined): void {
    let remaining = this.listeners.size;
    if (remaining === 0) return consumed();
    let done = false;
    for (const listener of [...this.listeners]) {
      listener(event, () => {
        if (done || --remaining > 0) return;
        done = true;
        consumed();
      });
    }
  }

  private finish(event: CommandEvent): void {
    if (this.final) return;
    this.final = event;
    clearTimeout(this.timer);
    this.emit(event);
    this.listeners.clear();
    this.onFinal(this, event);
  }
}

export class CommandRegistry {
  private readonly bySandbox = new Map<string, Map<string, RunningCommand>>();
  private readonly deferred: Array<() => void> = [];
  private deferredRun: NodeJS.Immediate | undefined;
  private closed = false;
  /** Command records being written. */
  private readonly pending = new Set<Promise<CommandRow | undefined> | undefined>();

  constructor(
    private readonly ledger: LedgerStore,
    private readonly opts: RegistryOptions,
  ) {}

  start(sandboxId: string, agent: AgentClient, request: CommandRequest): RunningCommand {
    const cmd = new RunningCommand(newCommandId(), sandboxId, request, this.opts.replayBytes, (c, ev) =>
      this.onFinal(c, ev),
    );
    const map = this.bySandbox.get(sandboxId) ?? new Map<string, RunningCommand>();
    map.set(cmd.id, cmd);
    this.bySandbox.set(sandboxId, map);
    cmd.start(agent, this.ledger, this.opts.log);
    return cmd;
  }

  /** Commands of the sandbox that have not ended yet. */
  running(sandboxId: string): number {
    let n = 0;
    for (const c of this.bySandbox.get(sandboxId)?.values() ?? []) if (!c.finished) n++;
    return n;
  }

  get(sandboxId: string, commandId: string): RunningCommand | undefined {
    return this.bySandbox.get(sandboxId)?.get(commandId);
  }

  /** The ledger's record of a command (after the writes of one held in memory have landed). */
  async info(sandboxId: string, commandId: string): Promise<CommandInfo> {
    await this.get(sandboxId, commandId)?.record?.catch(() => undefined);
    const row = await this.ledger.getCommand(commandId);
    if (!row || row.sandbox_id !== sandboxId)
      throw new BothyError(
        "command_not_found",
        `No command ${commandId} in sandbox ${sandboxId}; list them with GET /sandboxes/${sandboxId}/commands.`,
      );
    return toCommandInfo(row);
  }

  async list(sandboxId: string): Promise<CommandInfo[]> {
    await Promise.all(
      [...(this.bySandbox.get(sandboxId)?.values() ?? [])].map((c) => c.record?.catch(() => undefined)),
    );
    return (await this.ledger.listCommands(sandboxId)).map(toCommandInfo);
  }

  /** Drops everything held for a sandbox that is gone. */
  forget(sandboxId: string): void {
    this.bySandbox.delete(sandboxId);
  }

  /**
   * A command's end, after its listeners have had it. Its record is updated at once, so a
   * re-attach or GET right after the answer reads the end. After an exit, the log line, the
   * public event and the idle and pool bookkeeping run at the end of this turn of the event loop
   * (`later`): the answer's bytes and the client's next frames (a WebSocket's close) are not held
   * up by them, and they still run before any request the client sends after reading the answer.
   * A crash in between loses that log line and event only, never the record recovery reads.
   */
  private onFinal(cmd: RunningCommand, event: CommandEvent): void {
    // A command that never started has no record to update.
    const finish = (): Promise<CommandRow | undefined> =>
      event.type === "process_exited"
        ? this.ledger.finishCommand(cmd.id, {
            state: "exited",
            exit_code: event.exit_code,
            signal: event.signal ?? null,
            timed_out: event.timed_out ?? false,
          })
        : this.ledger.finishCommand(cmd.id, { state: "lost", exit_code: null, signal: null });
    const record = cmd.record?.then(finish);
    cmd.record = record;
    const written = record?.catch((err: unknown) => {
      this.opts.log("ledger_write_failed", {
        what: "command record",
        sandbox_id: cmd.sandboxId,
        error: (err as Error).message,
      });
      return undefined;
    });
    this.pending.add(written);
    void written?.finally(() => this.pending.delete(written));
    const rest = (row: CommandRow | undefined): void => {
      if (event.type === "process_exited")
        this.opts.log("command_exited", {
          sandbox_id: cmd.sandboxId,
          command_id: cmd.id,
          exit_code: event.exit_code,
          signal: event.signal ?? null,
          timed_out: event.timed_out ?? false,
        });
      else if (row)
        this.opts.log("command_lost", {
          sandbox_id: cmd.sandboxId,
          command_id: cmd.id,
          reason: event.type === "error" ? event.message : "",
        });
      if (row) this.opts.onExited(toCommandInfo(row));
      this.trim(cmd.sandboxId);
    };
    // A lost command is told as soon as its record is written, so its event still comes before its
    // sandbox's (stopped, deleted: their moves are written after the command's end).
    void (written ?? Promise.resolve(undefined)).then((row) =>
      event.type === "process_exited" ? this.later(() => rest(row)) : rest(row),
    );
  }

  /** Runs `work` at the end of this turn of the event loop (see `onFinal`), in order; at once once closed. */
  private later(work: () => void): void {
    if (this.closed) return work();
    this.deferred.push(work);
    this.deferredRun ??= setImmediate(() => this.flush());
  }

  private flush(): void {
    if (this.deferredRun) clearImmediate(this.deferredRun);
    this.deferredRun = undefined;
    const work = this.deferred.splice(0);
    for (const w of work) w();
  }

  /**
   * Waits for the records being written, runs the deferred work now, and any later at once: the
   * server calls it before it closes the ledger.
   */
  async close(): Promise<void> {
    this.closed = true;
    await Promise.all(this.pending);
    this.flush();
  }

  private trim(sandboxId: string): void {
    const map = this.bySandbox.get(sandboxId);
    if (!map) return;
    const finished = [...map.values()].filter((c) => c.finished);
    for (const old of finished.slice(0, Math.max(0, finished.length - this.opts.keepFinished))) map.delete(old.id);
  }
}

export function toCommandInfo(row: CommandRow): CommandInfo {
  return {
    command_id: row.id,
    sandbox_id: row.sandbox_id,
    cmd: row.cmd,
    state: row.state,
    background: row.background === 1,
    exit_code: row.exit_code,
    signal: row.signal,
    timed_out: row.timed_out === 1,
    started_at: row.started_at,
    ended_at: row.ended_at,
  };
}

/**
 * Why a command ended without an exit status. When the agent's channel closed under it, the
 * sandbox itself stopped: a deletion says so elsewhere, and the usual other cause is the sandbox
 * hitting its memory limit, which under gVisor ends the whole sandbox.
 */
function lostMessage(err: { code: string; message: string }, sandboxId: string): string {
  if (err.code !== "agent_unavailable") return err.message;
  return `${err.message} The sandbox stopped while this command ran: if it was not deleted or paused, it most likely ran out of memory (memory_mib limits the whole sandbox), or, in gVisor, of host tasks after a long fork bomb; GET /sandboxes/${sandboxId} shows its state.`;
}
