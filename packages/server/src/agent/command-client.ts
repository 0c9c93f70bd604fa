/**
 * Commands in the guest over the agent channel: `exec` starts one and hands back its handle
 * (stdin, signals, resize); its events come from the frames the guest sends for it, and its
 * output is credited back as the caller passes it on.
 */
import { BothyError, MAX_PAYLOAD_BYTES, type SignalName } from "@bothy/protocol";
import type { AgentChannel, PendingRequest, RequestFrame } from "./agent-channel.ts";

export interface ExecOptions {
  cmd: string;
  cwd?: string;
  env?: Record<string, string>;
  stdin?: boolean;
  pty?: { cols: number; rows: number };
}

export interface ExecEvents {
  onStarted(pid: number): void;
  /** Output bytes; call `consumed()` once they have been passed on, to let more flow. */
  onOutput(fd: 1 | 2, data: Buffer, consumed: () => void): void;
  onExited(code: number | null, signal: string | null, oomKilled?: boolean): void;
  onError(err: BothyError): void;
}

/** A running command inside the guest. */
export class ExecHandle {
  constructor(
    private readonly channel: Pick<AgentChannel, "send">,
    readonly requestId: number,
  ) {}

  stdin(data: Buffer, eof = false): void {
    for (let off = 0; off < data.length || (off === 0 && eof); off += MAX_PAYLOAD_BYTES) {
      const part = data.subarray(off, off + MAX_PAYLOAD_BYTES);
      const last = off + MAX_PAYLOAD_BYTES >= data.length;
      this.channel.send({ t: "stdin", id: this.requestId, eof: eof && last }, part);
      if (last) break;
    }
  }

  signal(signal: SignalName): void {
    this.channel.send({ t: "signal", id: this.requestId, signal });
  }

  resize(cols: number, rows: number): void {
    this.channel.send({ t: "resize", id: this.requestId, cols, rows });
  }
}

export class CommandClient {
  /** Variables every command gets beneath its own (SandboxSpec.commandEnv). */
  commandEnv: Record<string, string> = {};

  constructor(private readonly channel: AgentChannel) {}

  exec(options: ExecOptions, events: ExecEvents): ExecHandle {
    const id = this.channel.allocate(new CommandRequest(this.channel, events));
    this.channel.send({
      t: "exec",
      id,
      cmd: options.cmd,
      cwd: options.cwd,
      env: { ...this.commandEnv, ...options.env },
      stdin: options.stdin ?? false,
      pty: options.pty,
    });
    return new ExecHandle(this.channel, id);
  }
}

/** One command's frames, as its events. */
class CommandRequest implements PendingRequest {
  constructor(
    private readonly channel: AgentChannel,
    private readonly events: ExecEvents,
  ) {}

  frame(frame: RequestFrame, payload: Buffer): boolean {
    const id = frame.id;
    if (id === undefined) return false;
    switch (frame.t) {
      case "started":
        this.events.onStarted(frame.pid);
        return true;
      case "output":
        this.events.onOutput(frame.fd, payload, () => this.channel.creditOutput(id, Math.max(1, payload.length)));
        return true;
      case "exited":
        this.channel.settle(id);
        this.channel.forgetCredit(id);
        this.events.onExited(frame.code, frame.signal, frame.oom_killed === true);
        return true;
      case "error":
        if (frame.code === "spawn_failed")
          this.events.onError(new BothyError("invalid_command", `The command could not start: ${frame.message}`));
        return true; // a command still ends with its own `exited` frame
      default:
        return false;
    }
  }

  fail(err: BothyError): void {
    this.events.onError(err);
  }
}
