import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { EventEmitter } from "node:events";
import { existsSync, mkdirSync } from "node:fs";
import { connect, Socket } from "node:net";
import { constants } from "node:os";
import type { Readable, Writable } from "node:stream";
import { agentEnv } from "./agent-env.ts";

/**
 * Starting commands through bothy-helper's resident spawner (native/spawner.c) instead of Node's
 * child_process.spawn, which costs ~95 ms per process inside gVisor (a fork of the small static
 * helper and one exec cost a fraction of that). A command's stdin, stdout and stderr are unix
 * stream connections the agent makes to the helper's socket: the helper hands them to
 * the child as its fds, so output reaches a net.Socket here directly, paused and resumed as
 * before, with the kernel's backpressure and no relay. Node cannot receive fds (SCM_RIGHTS), and
 * named FIFOs would need a file per stream to make and clean up; connections need one socket file.
 * A few connections are made ahead of need (spares, refilled once a command is over), so a
 * command's path holds one request to the helper and no connect, accept or hello.
 *
 * In gVisor bothy-init starts the helper beside the agent (agent-env.ts `spawner`), so it is up
 * as soon as the agent is, without a child_process.spawn (~40 ms of the agent's start under
 * ptrace); elsewhere the agent starts it.
 *
 * Where the helper is missing (an agent run outside a sandbox, an initramfs from before it) or
 * not up yet (the first moments of an agent), commands go through child_process as before.
 */

/** A started process as Command uses it: ChildProcess's shape, events `spawn`, `error`, `exit`, `close`. */
export interface Proc extends EventEmitter {
  readonly pid?: number | undefined;
  readonly stdin: Writable | null;
  readonly stdout: Readable | null;
  readonly stderr: Readable | null;
}

export interface SpawnOptions {
  file: string;
  args: string[];
  cwd: string;
  env: NodeJS.ProcessEnv;
  stdin: boolean;
  /** A cgroup directory the process joins before it execs (it exits 126 if it cannot). */
  cgroup?: string;
  /** Gives up the agent's OOM-killer exemption, which children inherit. */
  resetOomScore: boolean;
}

const FLAG_OOM_ADJ = 1;
const TOKEN_BYTES = 16;
/** Connections kept ready for the next commands: two commands' stdout and stderr. */
const SPARE_STREAMS = 4;
/** Where the helper listens (the agent's pid in the name: a restarted agent starts another). */
const SOCKET_DIR = "/run/bothy";

const signalNames = new Map<number, NodeJS.Signals>(
  Object.entries(constants.signals).map(([name, n]) => [n, name as NodeJS.Signals]),
);
/** A connection to the helper and the number its hello gave it. */
interface Stream {
  id: number;
  socket: Socket;
}

const errnoNames = new Map<number, string>(Object.entries(constants.errno).map(([name, n]) => [n, name]));

class HelperProcess extends EventEmitter implements Proc {
  pid: number | undefined;
  readonly stdin: Socket | null;
  readonly stdout: Socket | null;
  readonly stderr: Socket | null;
  private exited = false;
  private open = 0;

  constructor(
    readonly seq: number,
    readonly file: string,
    streams: { stdin: Socket | null; stdout: Socket | null; stderr: Socket | null },
  ) {
    super();
    this.stdin = streams.stdin;
    this.stdout = streams.stdout;
    this.stderr = streams.stderr;
    // Nothing comes back on stdin's connection; reading it lets it end and close with the command.
    this.stdin?.resume();
    for (const s of [this.stdout, this.stderr]) {
      if (!s) continue;
      this.open++;
      // Output waits for `started`: the command can write before the helper's line that says so
      // is read (they come on different fds), and the host must see `started` first.
      s.pause();
      s.once("close", () => {
        this.open--;
        this.maybeClose();
      });
    }
  }

  started(pid: number): void {
    this.pid = pid;
    this.emit("spawn");
    this.stdout?.resume();
    this.stderr?.resume();
  }

  failed(step: number, errno: number): void {
    const code = errnoNames.get(errno) ?? `errno ${errno}`;
    const err: NodeJS.ErrnoException = new Error(
      `spawn ${this.file} ${code}${step === 1 ? " (working directory)" : ""}`,
    );
    err.code = code;
    for (const s of [this.stdin, this.stdout, this.stderr]) s?.destroy();
    this.emit("error", err);
  }

  exit(code: number | null, signal: NodeJS.Signals | null): void {
    if (this.exited) return;
    this.exited = true;
    this.emit("exit", code, signal);
    this.maybeClose();
  }

  private maybeClose(): void {
    if (this.exited && this.open === 0) this.emit("close");
  }
}

export class Spawner {
  private readonly procs = new Map<number, HelperProcess>();
  private readonly token = randomBytes(TOKEN_BYTES).toString("hex");
  private seq = 0;
  /** Connections to the helper not yet given to a command, with their numbers (see native/spawner.c). */
  private readonly spares: Stream[] = [];
  private streamSeq = 0;
  private refillQueued = false;
  private ready = false;
  private gone = false;
  private lineBuf = "";
  private settle!: () => void;
  /** Resolves once the helper listens, or has failed (commands then go through Node). */
  readonly settled = new Promise<void>((resolve) => (this.settle = resolve));

  /** `requests` carries requests to the helper, `answers` its lines back; `gone` says it has ended. */
  private constructor(
    private readonly requests: Writable,
    answers: Readable,
    gone: (lost: () => void) => void,
    private readonly socketPath: string,
  ) {
    gone(() => this.lost());
    requests.on("error", () => undefined);
    answers.setEncoding("utf8");
    answers.on("data", (text: string) => this.onLines(text));
    this.request(["token", this.token]);
  }

  /**
   * The helper's spawner: the one bothy-init started beside the agent (gVisor), else one started
   * here when the helper exists; undefined otherwise.
   */
  static start(path = agentEnv().helper): Spawner | undefined {
    const started = agentEnv().spawner;
    if (started) {
      // Its only connection: the helper takes the first from this process and closes the listener.
      const control = connect({ path: started.control });
      return new Spawner(
        control,
        control,
        (lost) => {
          control.once("error", lost);
          control.once("close", lost);
        },
        started.streams,
      );
    }
    if (!existsSync(path)) return undefined;
    try {
      mkdirSync(SOCKET_DIR, { recursive: true, mode: 0o700 });
    } catch {
      return undefined;
    }
    const socketPath = `${SOCKET_DIR}/spawner-${process.pid}.sock`;
    const helper = spawn(path, ["spawner", socketPath], { stdio: ["pipe", "pipe", "inherit"] });
    return new Spawner(
      helper.stdin,
      helper.stdout,
      (lost) => {
        helper.once("error", lost);
        helper.once("exit", lost);
      },
      socketPath,
    );
  }

  /** True once the helper listens (a command before that goes through child_process). */
  get available(): boolean {
    return this.ready && !this.gone;
  }

  /** Starts a process with stdout and stderr streamed back; stdin streamed too on request. */
  spawn(opts: SpawnOptions): Proc {
    const seq = ++this.seq;
    const stdin = opts.stdin ? this.takeStream() : undefined;
    const stdout = this.takeStream();
    const stderr = this.takeStream();
    const proc = new HelperProcess(seq, opts.file, {
      stdin: stdin?.socket ?? null,
      stdout: stdout.socket,
      stderr: stderr.socket,
    });
    this.procs.set(seq, proc);
    this.send(seq, opts, opts.resetOomScore ? FLAG_OOM_ADJ : 0, [stdin?.id ?? 0, stdout.id, stderr.id]);
    // The next commands' streams, once this one is over and its end reported.
    proc.once("close", () => this.refill());
    proc.once("error", () => this.refill());
    return proc;
  }

  /** Runs a process without stdio and resolves when it has ended (however it ended). */
  runQuiet(file: string, args: string[]): Promise<void> {
    const seq = ++this.seq;
    const proc = new HelperProcess(seq, file, { stdin: null, stdout: null, stderr: null });
    this.procs.set(seq, proc);
    this.send(seq, { file, args, cwd: "/", env: process.env, stdin: false, resetOomScore: false }, 0, [0, 0, 0]);
    return new Promise((resolve) => {
      proc.once("error", () => resolve());
      proc.once("exit", () => resolve());
    });
  }

  /** A spare connection, or a new one when none is left (the helper waits for its hello). */
  private takeStream(): Stream {
    return this.spares.shift() ?? this.connectStream();
  }

  private connectStream(): Stream {
    const id = ++this.streamSeq;
    const socket = new Socket();
    socket.on("error", () => undefined); // a command's own handlers report what matters to it
    // Not read until its command has started (HelperProcess): paused before the connect, so
    // reading never starts only to be stopped again.
    socket.pause();
    socket.connect({ path: this.socketPath });
    socket.write(`${this.token} ${String(id).padStart(10)}\n`);
    return { id, socket };
  }

  /** Tops the spares up on the next turn of the event loop, after the I/O at hand is handled. */
  private refill(): void {
    if (this.refillQueued || this.gone) return;
    this.refillQueued = true;
    setImmediate(() => {
      this.refillQueued = false;
      if (this.gone) return;
      while (this.spares.length < SPARE_STREAMS) this.spares.push(this.connectStream());
    });
  }

  private send(seq: number, opts: SpawnOptions, flags: number, streams: [number, number, number]): void {
    const env = Object.entries(opts.env)
      .filter((e): e is [string, string] => e[1] !== undefined)
      .map(([k, v]) => `${k}=${v}`);
    this.request([
      "spawn",
      String(seq),
      String(flags),
      opts.cgroup ?? "",
      opts.cwd,
      ...streams.map(String),
      String(1 + opts.args.length),
      opts.file,
      ...opts.args,
      ...env,
    ]);
  }

  private request(fields: string[]): void {
    const body = Buffer.from(fields.map((f) => `${f}\0`).join(""));
    const len = Buffer.alloc(4);
    len.writeUInt32LE(body.length);
    this.requests.write(Buffer.concat([len, body]));
  }

  private onLines(text: string): void {
    this.lineBuf += text;
    let nl: number;
    while ((nl = this.lineBuf.indexOf("\n")) >= 0) {
      const [word, a, b, c] = this.lineBuf.slice(0, nl).split(" ");
      this.lineBuf = this.lineBuf.slice(nl + 1);
      const seq = Number(a);
      const proc = this.procs.get(seq);
      if (word === "ready") {
        this.ready = true;
        this.settle();
        this.refill();
      } else if (!proc) continue;
      else if (word === "started") proc.started(Number(b));
      else if (word === "failed") {
        this.procs.delete(seq);
        proc.failed(Number(b), Number(c));
      } else if (word === "exited") {
        this.procs.delete(seq);
        proc.exit(Number(b) < 0 ? null : Number(b), Number(b) < 0 ? (signalNames.get(Number(c)) ?? "SIGKILL") : null);
      }
    }
  }

  /** The helper ended: what it had started is beyond reach; later commands use child_process. */
  private lost(): void {
    if (this.gone) return;
    this.gone = true;
    this.settle();
    process.stderr.write("bothy-agent: the spawner helper ended; commands start through Node from now on\n");
    for (const proc of this.procs.values()) {
      if (proc.pid === undefined) proc.failed(2, constants.errno.ECHILD);
      else proc.exit(null, null);
    }
    this.procs.clear();
    for (const spare of this.spares.splice(0)) spare.socket.destroy();
  }
}
