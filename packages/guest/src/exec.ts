import { spawn } from "node:child_process";
import { mkdirSync, readFileSync, rmdir, writeFileSync } from "node:fs";
import type { Readable } from "node:stream";
import { OUTPUT_CHUNK_BYTES, OUTPUT_WINDOW_BYTES, type ParsedHostFrame, type SignalName } from "@bothy/protocol";
import type { Channel } from "./channel.ts";
import { agentEnv } from "./agent-env.ts";
import { ptyArgs, resizePty, SCRIPT_PATH, signalSession, type PtySize } from "./pty.ts";
import type { Proc, Spawner } from "./spawner.ts";

type ExecFrame = Extract<ParsedHostFrame, { t: "exec" }>;

/** How long to wait for output pipes to close after the shell exits before closing them ourselves. */
const PIPE_GRACE_MS = 500;
/** What one read of a child's pipe takes at most (libuv's read size). */
const PIPE_READ_BYTES = 64 * 1024;

let cgroupSeq = 0;

/**
 * The cgroup a command joins before it runs, so the process limit counts all it starts (one that
 * cannot join does not run). In a VM each command has a cgroup of its own under the commands'
 * one, so a SIGKILL can end every process it made (cgroup.kill), however it forks; gVisor's pids
 * controller charges a cgroup's own tasks only, so there the commands share the limited cgroup
 * itself. Returns the cgroup to join and the one made for this command (to remove at its end).
 */
function commandCgroup(): { join: string | undefined; own: string | undefined } {
  const { commandsCgroup, inVm } = agentEnv();
  let own: string | undefined;
  if (commandsCgroup && inVm) {
    try {
      own = `${commandsCgroup}/c${++cgroupSeq}`;
      mkdirSync(own);
    } catch {
      own = undefined;
    }
  }
  return { join: own ?? commandsCgroup, own };
}

/**
 * Without the spawner helper, what a command's shell does first: it joins the cgroup itself,
 * and in a VM gives up the agent's OOM-killer exemption, which children inherit (else an
 * out-of-memory guest has nothing to kill and panics). The helper does both before its exec.
 */
function shellPrefix(join: string | undefined): string {
  return [
    ...(join
      ? [
          `{ echo $$ > ${join}/cgroup.procs; } 2>/dev/null || { echo "bothy: this command could not join the sandbox's process-limited cgroup" >&2; exit 126; };`,
        ]
      : []),
    ...(agentEnv().inVm ? ["echo 0 > /proc/$$/oom_score_adj 2>/dev/null;"] : []),
  ].join(" ");
}

/** How often, and how many times, a SIGKILL is sent again to a process group that is still there. */
const GROUP_KILL_INTERVAL_MS = 50;
const GROUP_KILL_TRIES = 100;

/**
 * SIGKILLs a process group until none of it is left: a process caught in the middle of a fork
 * can leave a child that missed the signal (gVisor, where commands have no cgroup of their own
 * to kill at once), and a fork bomb's survivors would carry on without their command.
 */
function killGroupUntilGone(pgid: number): void {
  let tries = 0;
  const again = (): void => {
    try {
      process.kill(-pgid, "SIGKILL");
    } catch {
      return; // ESRCH: nothing of the group is left
    }
    if (++tries < GROUP_KILL_TRIES) setTimeout(again, GROUP_KILL_INTERVAL_MS).unref();
  };
  again();
}

/** How many processes the kernel's OOM killer has ended so far (Linux guests; undefined elsewhere). */
function oomKills(): number | undefined {
  try {
    const n = /^oom_kill (\d+)$/m.exec(readFileSync("/proc/vmstat", "utf8"))?.[1];
    return n === undefined ? undefined : Number(n);
  } catch {
    return undefined;
  }
}

/**
 * One running command. Output is forwarded under a credit window: once OUTPUT_WINDOW_BYTES are
 * unacknowledged, or the channel is congested, the pipes are paused, so a command printing
 * without end is slowed to the pace of the slowest reader instead of filling memory.
 */
export class Command {
  private readonly child: Proc;
  private inflight = 0;
  private paused = false;
  private finished = false;
  /** Its host is gone: the command runs on, its output is read and dropped, its end not reported. */
  private detached = false;
  private exitCode: number | null = null;
  private exitSignal: NodeJS.Signals | null = null;
  private exitedAt = 0;
  private graceTimer: NodeJS.Timeout | undefined;
  private readonly stopDrainWatch: () => void;
  private pty: PtySize | undefined;
  private resizing: Promise<void> = Promise.resolve();
  /** Only VM guests have an OOM killer of their own to ask (gVisor ends the whole sandbox). */
  private readonly oomKillsAtStart = agentEnv().inVm ? oomKills() : undefined;
  private readonly cgroup: string | undefined;
  /** The helper that started it, when one did (also runs its resizes' stty). */
  private readonly spawner: Spawner | undefined;
  /** Pipes resting after a short read, so that the next read finds more (see agentEnv().outputRestMs). */
  private readonly resting = new Set<Readable>();

  constructor(
    readonly id: number,
    frame: ExecFrame,
    baseEnv: NodeJS.ProcessEnv,
    private readonly channel: Channel,
    private readonly onDone: (id: number) => void,
    spawner: Spawner | undefined,
  ) {
    this.pty = frame.pty;
    const cgroup = commandCgroup();
    this.cgroup = cgroup.own;
    const fast = spawner?.available ? spawner : undefined;
    this.spawner = fast;
    // Through the helper the process joins the cgroup before its exec; through Node a prefix
    // in its shell does, and then that first shell becomes the command's own shell (exec): the
    // same process, so exit codes and signals read exactly as without it. On a terminal only
    // the command behind `script` joins (the prefix, either way): a SIGKILL's cgroup.kill then
    // ends the command, and `script` reports its status as a terminal's shell would.
    const helperJoins = fast !== undefined && !frame.pty;
    const prefix = helperJoins ? "" : shellPrefix(cgroup.join);
    const env = {
      ...baseEnv,
      ...(frame.pty ? { TERM: "xterm-256color", BOTHY_PTY_CMD: prefix ? `${prefix} ${frame.cmd}` : frame.cmd } : {}),
      ...frame.env,
    };
    const shell: [string, string[]] = prefix
      ? ["/bin/sh", ["-c", `${prefix} exec /bin/sh -c "$1"`, "sh", frame.cmd]]
      : ["/bin/sh", ["-c", frame.cmd]];
    const [file, args] = frame.pty ? [SCRIPT_PATH, ptyArgs(frame.pty)] : shell;
    // A terminal always has input; without one the command still gets a stream only on request.
    const stdin = frame.stdin || frame.pty !== undefined;
    const cwd = frame.cwd ?? "/workspace";
    this.child = fast
      ? fast.spawn({
          file,
          args,
          cwd,
          env,
          stdin,
          cgroup: helperJoins ? cgroup.join : undefined,
          resetOomScore: helperJoins && agentEnv().inVm,
        })
      : spawn(file, args, {
          cwd,
          env,
          stdio: [stdin ? "pipe" : "ignore", "pipe", "pipe"],
          // Its own process group, so a signal reaches the whole pipeline the shell started.
          detached: true,
        });
    this.stopDrainWatch = channel.onDrain(() => this.updateFlow());
    this.child.once("spawn", () => channel.send({ t: "started", id, pid: this.child.pid ?? -1 }));
    this.child.once("error", (err: Error) => {
      const message =
        frame.pty && (err as NodeJS.ErrnoException).code === "ENOENT"
          ? `PTY mode needs ${SCRIPT_PATH} (util-linux) in the template`
          : err.message;
      channel.send({ t: "error", id, code: "spawn_failed", message });
      this.finish(127, null);
    });
    this.child.stdin?.on("error", () => undefined); // EPIPE when the command ignores its input
    this.pipe(this.child.stdout, 1);
    this.pipe(this.child.stderr, 2);
    this.child.once("exit", (code: number | null, signal: NodeJS.Signals | null) => {
      this.exitCode = code;
      this.exitSignal = signal;
      this.exitedAt = Date.now();
      this.armGrace();
    });
    this.child.once("close", () => this.finish(this.exitCode, this.exitSignal));
  }

  credit(bytes: number): void {
    this.inflight = Math.max(0, this.inflight - bytes);
    this.updateFlow();
  }

  stdin(data: Buffer, eof: boolean): void {
    const stdin = this.child.stdin;
    if (!stdin || stdin.destroyed) return;
    if (data.length > 0) stdin.write(data);
    if (eof) stdin.end();
  }

  /** New terminal size for a PTY command; ignored otherwise. */
  resize(size: PtySize): void {
    const pid = this.child.pid;
    if (!this.pty || pid === undefined || this.exitedAt !== 0) return;
    this.pty = size;
    // One stty at a time, each applying the newest size: resizes that overlap (a terminal sends
    // one per SIGWINCH, and a window change can be two) must not finish out of order.
    this.resizing = this.resizing
      .then(() => (this.pty && this.exitedAt === 0 ? resizePty(pid, this.pty, this.spawner) : undefined))
      .catch(() => undefined);
  }

  signal(sig: SignalName): void {
    const pid = this.child.pid;
    // SIGKILL ends everything the command started, also what outlived its shell or left its group.
    if (sig === "SIGKILL" && this.cgroup) {
      try {
        writeFileSync(`${this.cgroup}/cgroup.kill`, "1");
      } catch {
        // no cgroup.kill (older kernel): the process group below
      }
    }
    if (pid === undefined || this.finished) return;
    // Also once its shell is gone: what the shell left in its group still holds the output open
    // (the group's id is not reused while any of it lives).
    if (sig === "SIGKILL" && !this.pty) return killGroupUntilGone(pid);
    if (this.exitedAt !== 0) return;
    if (this.pty) {
      void signalSession(pid, sig);
      return;
    }
    try {
      process.kill(-pid, sig);
    } catch {
      // The group is already gone; the exit event reports it.
    }
  }

  /** Kills the command's process group; used when the host goes away. */
  kill(): void {
    this.signal("SIGKILL");
  }

  /**
   * The host that started it is gone (a server restart, a pause): the command keeps running,
   * since a later host cannot know it, its output is drained so it never blocks on a full pipe.
   */
  detach(): void {
    this.detached = true;
    this.inflight = 0;
    this.stopDrainWatch();
    this.child.stdin?.destroy();
    this.paused = false;
    this.child.stdout?.resume();
    this.child.stderr?.resume();
  }

  private pipe(stream: Readable | null, fd: 1 | 2): void {
    if (!stream) return;
    stream.on("data", (chunk: Buffer) => {
      if (this.detached) return;
      for (let off = 0; off < chunk.length; off += OUTPUT_CHUNK_BYTES) {
        const part = chunk.subarray(off, off + OUTPUT_CHUNK_BYTES);
        this.inflight += part.length;
        this.channel.send({ t: "output", id: this.id, fd }, part);
      }
      const restMs = agentEnv().outputRestMs;
      if (restMs > 0 && chunk.length < PIPE_READ_BYTES && !this.resting.has(stream)) {
        this.resting.add(stream);
        stream.pause();
        setTimeout(() => {
          this.resting.delete(stream);
          if (!this.paused) stream.resume();
        }, restMs);
      }
      this.updateFlow();
      if (this.exitedAt !== 0) this.armGrace();
    });
    stream.on("error", () => undefined);
  }

  private updateFlow(): void {
    if (this.detached) return;
    const shouldPause = this.inflight >= OUTPUT_WINDOW_BYTES || this.channel.isCongested;
    if (shouldPause === this.paused) return;
    this.paused = shouldPause;
    for (const s of [this.child.stdout, this.child.stderr]) {
      if (shouldPause) s?.pause();
      else if (s && !this.resting.has(s)) s.resume();
    }
    if (!shouldPause && this.exitedAt !== 0) this.armGrace();
  }

  /**
   * A background job started by the command (`sleep 100 &`) keeps the pipes open after the shell
   * exits. Once output has gone quiet for PIPE_GRACE_MS after exit, the command is over.
   */
  private armGrace(): void {
    if (this.finished) return;
    clearTimeout(this.graceTimer);
    this.graceTimer = setTimeout(() => {
      if (this.paused) return; // output still waiting for credit; updateFlow re-arms
      this.child.stdout?.destroy();
      this.child.stderr?.destroy();
      this.finish(this.exitCode, this.exitSignal);
    }, PIPE_GRACE_MS);
  }

  private finish(code: number | null, signal: NodeJS.Signals | null): void {
    if (this.finished) return;
    this.finished = true;
    clearTimeout(this.graceTimer);
    this.stopDrainWatch();
    // Killed (by SIGKILL, or a shell reporting 128+9) while the kernel's OOM killer was at work:
    // most likely by it, the cause that matters.
    const before = this.oomKillsAtStart;
    const after = before !== undefined && (signal === "SIGKILL" || code === 137) ? oomKills() : undefined;
    const oomKilled = before !== undefined && after !== undefined && after > before;
    if (!this.detached)
      this.channel.send({ t: "exited", id: this.id, code, signal, ...(oomKilled ? { oom_killed: true } : {}) });
    // Empty once everything the command started has ended; what it left running keeps it.
    if (this.cgroup) rmdir(this.cgroup, () => undefined);
    this.onDone(this.id);
  }
}
