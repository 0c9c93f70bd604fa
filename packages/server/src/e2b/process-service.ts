import { Code, ConnectError, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { BothyError, commandRequest, isErrorCode, ptySize, type CommandEvent } from "@bothy/protocol";
import type { CommandRegistry, RunningCommand } from "../commands/command-registry.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import { toConnectError } from "./e2b-errors.ts";
import type { E2bProcess, E2bState } from "./e2b-state.ts";
import {
  Process,
  Signal,
  type ProcessEventSchema,
  type ProcessSelector,
  type StartRequest,
  type StartResponseSchema,
} from "./gen/process_pb.ts";
import { Wakeup } from "../util/wakeup.ts";
import { execQuiet } from "../agent/quiet-exec.ts";
import type { MappedCommand } from "./desktop-commands.ts";

type StartResponseInit = MessageInitShape<typeof StartResponseSchema>;
type ProcessEventInit = MessageInitShape<typeof ProcessEventSchema>;

/** How Go (envd) words a death by signal in `status`: "signal: killed". */
const GO_SIGNAL_TEXT: Record<string, string> = {
  SIGKILL: "killed",
  SIGTERM: "terminated",
  SIGINT: "interrupt",
  SIGHUP: "hangup",
  SIGQUIT: "quit",
  SIGPIPE: "broken pipe",
  SIGABRT: "aborted",
  SIGSEGV: "segmentation fault",
};

/** One argument for `/bin/sh -c`, quoted so the shell passes it through unchanged. */
function shellQuote(arg: string): string {
  return `'${arg.replace(/'/g, `'\\''`)}'`;
}

/** The user an envd call names (`Authorization: Basic base64("user:")`); bothy has only root. */
export function checkRpcUser(ctx: HandlerContext): void {
  const auth = ctx.requestHeader.get("authorization");
  if (auth === null) return;
  const user = /^Basic\s+(.+)$/i.exec(auth)?.[1];
  const name = user === undefined ? undefined : Buffer.from(user, "base64").toString("utf8").split(":")[0];
  if (name !== "root")
    throw new ConnectError(
      `User "${name ?? "?"}" does not exist in bothy sandboxes; omit the user (root).`,
      Code.Unauthenticated,
    );
}

export function sandboxOf(ctx: HandlerContext): string {
  const id = ctx.requestHeader.get("e2b-sandbox-id");
  if (id === null) throw new ConnectError("E2b-Sandbox-Id header missing", Code.InvalidArgument);
  return id;
}

/** How long a signal to a process from before a restart may take in the guest. */
const SIGNAL_TIMEOUT_MS = 10_000;

/** Signal numbers of the signals envd's SendSignal carries. */
const SIGNAL_NUMBERS: Record<string, number> = { SIGKILL: 9, SIGTERM: 15 };

/**
 * A terminal's process runs under `script`, which exits 128+N when the process dies of signal N:
 * after a SendSignal that status is the signal's death, as envd reports it.
 */
function endEvent(event: Extract<CommandEvent, { type: "process_exited" }>, process?: E2bProcess): ProcessEventInit {
  const signalled = process?.pty ? process.signalled : undefined;
  if (signalled && event.exit_code === 128 + (SIGNAL_NUMBERS[signalled] ?? 0))
    event = { ...event, exit_code: null, signal: signalled };
  if (event.exit_code !== null) {
    const status = `exit status ${event.exit_code}`;
    const end = {
      exitCode: event.exit_code,
      exited: true,
      status,
      ...(event.exit_code === 0 ? {} : { error: status }),
    };
    return { event: { case: "end", value: end } };
  }
  const status = `signal: ${GO_SIGNAL_TEXT[event.signal ?? ""] ?? (event.signal ?? "unknown").toLowerCase()}`;
  return { event: { case: "end", value: { exitCode: -1, exited: false, status, error: status } } };
}

function asBothyError(event: Extract<CommandEvent, { type: "error" }>): BothyError {
  return new BothyError(isErrorCode(event.code) ? event.code : "internal", event.message);
}

/**
 * A command's events as an async iterable: each is acknowledged (credit back to the guest) only
 * once the stream has taken it, so a slow client slows the command instead of filling memory.
 * After `keepaliveMs` without an event it yields `keepalive`, as envd does.
 */
async function* follow(
  command: RunningCommand,
  signal: AbortSignal,
  keepaliveMs: number | undefined,
): AsyncGenerator<CommandEvent | "keepalive"> {
  const queue: { event: CommandEvent; written: () => void }[] = [];
  const wakeup = new Wakeup();
  const detach = command.attach((event, written) => {
    queue.push({ event, written });
    wakeup.wake();
  }, false);
  const onAbort = (): void => wakeup.wake();
  signal.addEventListener("abort", onAbort);
  try {
    for (;;) {
      const item = queue.shift();
      if (item) {
        try {
          yield item.event;
        } finally {
          item.written();
        }
        continue;
      }
      if (signal.aborted) return;
      if (await wakeup.wait(keepaliveMs)) yield "keepalive";
    }
  } finally {
    signal.removeEventListener("abort", onAbort);
    detach();
    for (const item of queue.splice(0)) item.written();
  }
}

/** bothy's events of one command as envd's process events, until its end event. */
async function* processEvents(
  command: RunningCommand,
  ctx: HandlerContext,
  pty: boolean,
  /** The process already known (Connect), or made known by the `started` event (Start). */
  known: E2bProcess | undefined,
  onStarted: (pid: number) => E2bProcess | undefined,
): AsyncGenerator<ProcessEventInit> {
  let process = known;
  const interval = Number(ctx.requestHeader.get("keepalive-ping-interval"));
  const keepaliveMs = Number.isFinite(interval) && interval > 0 ? interval * 1000 : undefined;
  for await (const event of follow(command, ctx.signal, keepaliveMs)) {
    if (event === "keepalive") {
      yield { event: { case: "keepalive", value: {} } };
      continue;
    }
    switch (event.type) {
      case "started":
        process = onStarted(event.pid);
        yield { event: { case: "start", value: { pid: event.pid } } };
        break;
      case "stdout":
      case "stderr": {
        const bytes = Buffer.from(event.data, event.encoding === "base64" ? "base64" : "utf8");
        // A terminal's output (bothy sends it as stdout) is envd's `pty` stream.
        const stream = pty ? "pty" : event.type;
        yield { event: { case: "data", value: { output: { case: stream, value: bytes } } } };
        break;
      }
      case "process_exited":
        yield endEvent(event, process);
        return;
      case "error":
        throw toConnectError(asBothyError(event));
      case "output_dropped":
        break;
    }
  }
}

const SIGNALS: Partial<Record<Signal, "SIGKILL" | "SIGTERM">> = {
  [Signal.SIGKILL]: "SIGKILL",
  [Signal.SIGTERM]: "SIGTERM",
};

/** The command bothy runs for a line an SDK sends to `/bin/bash -l -c` (e2b/desktop-commands.ts). */
export type LineMapper = (ctx: HandlerContext, sandboxId: string, line: string) => MappedCommand | undefined;

/**
 * envd's `process.Process` on bothy's command registry. Every command runs as a bothy background
 * command: closing the stream leaves it running (as in envd), and the deadline
 * (`Connect-Timeout-Ms`) kills it. Processes are named by guest pid (or tag), which `E2bState`
 * maps to bothy command ids.
 */
export function processService(
  manager: SandboxManager,
  registry: CommandRegistry,
  state: E2bState,
  mapLine: LineMapper = () => undefined,
): Partial<ServiceImpl<typeof Process>> {
  /** The running command a selector names; a finished or unknown one is `not_found`, as in envd. */
  const selected = async (
    ctx: HandlerContext,
    selector: ProcessSelector | undefined,
  ): Promise<{ pid: number; process: E2bProcess; command: RunningCommand; sandboxId: string }> => {
    checkRpcUser(ctx);
    const sandboxId = sandboxOf(ctx);
    await state.ready(sandboxId);
    const sel = selector?.selector;
    let pid: number | undefined;
    let process: E2bProcess | undefined;
    if (sel?.case === "pid") {
      pid = sel.value;
      process = state.process(sandboxId, pid);
    } else if (sel?.case === "tag") {
      [pid, process] = state.listProcesses(sandboxId).find(([, p]) => p.tag === sel.value) ?? [];
    }
    const command = process && registry.get(sandboxId, process.commandId);
    if (pid === undefined || !process || !command || command.finished) {
      if (pid !== undefined && command?.finished) state.dropProcess(sandboxId, pid);
      throw new ConnectError(`process ${sel?.value ?? "?"} not found`, Code.NotFound);
    }
    return { pid, process, command, sandboxId };
  };

  /** A pid of the map (by pid or tag) whose bothy command this server never knew: one started before a restart. */
  const fromBeforeRestart = async (
    ctx: HandlerContext,
    selector: ProcessSelector | undefined,
  ): Promise<{ pid: number; process: E2bProcess } | undefined> => {
    checkRpcUser(ctx);
    const sandboxId = sandboxOf(ctx);
    await state.ready(sandboxId);
    const sel = selector?.selector;
    const found: [number, E2bProcess] | undefined =
      sel?.case === "pid"
        ? ((p) => (p ? [sel.value, p] : undefined))(state.process(sandboxId, sel.value))
        : sel?.case === "tag"
          ? state.listProcesses(sandboxId).find(([, p]) => p.tag === sel.value)
          : undefined;
    if (!found || registry.get(sandboxId, found[1].commandId)) return undefined;
    return { pid: found[0], process: found[1] };
  };

  /**
   * A process started before a server restart: the restart lost its bothy command (its output and
   * end), but it runs on in the guest, detached, leading its own process group under the pid the
   * map names. It is signalled there as that group (`kill -- -PID` reaches nothing once the group
   * is gone: no stray pid is hit, only a new group leader that reused the number could be, in the
   * caller's own sandbox). False when it is gone.
   */
  const signalBeforeRestart = async (sandboxId: string, pid: number, signal: string): Promise<boolean> => {
    const cmd = `kill -s ${signal.replace(/^SIG/, "")} -- -${pid}`;
    const { code } = await execQuiet(
      await manager.agent(sandboxId),
      cmd,
      SIGNAL_TIMEOUT_MS,
      `Signalling ${pid}`,
      "agent_timeout",
    );
    return code === 0;
  };

  return {
    async *start(req: StartRequest, ctx: HandlerContext): AsyncGenerator<StartResponseInit> {
      checkRpcUser(ctx);
      const sandboxId = sandboxOf(ctx);
      const size = req.pty?.size;
      if (req.pty && !size) throw new ConnectError("pty.size is required for a PTY", Code.InvalidArgument);
      const proc = req.process;
      if (!proc?.cmd) throw new ConnectError("process.cmd is required", Code.InvalidArgument);
      let command: RunningCommand;
      // What the process list keeps: the SDK's own args, unless a mapped line held a credential.
      let recordedArgs = proc.args;
      try {
        const agent = await manager.agent(sandboxId);
        if (proc.cwd !== undefined && proc.cwd !== "") {
          const where = await agent.stat(proc.cwd).catch((err: unknown) => {
            if (err instanceof BothyError && err.code === "file_not_found") return undefined;
            throw err;
          });
          if (where?.type !== "dir")
            throw new ConnectError(`cwd ${proc.cwd} is not a directory in the sandbox`, Code.InvalidArgument);
        }
        let args = proc.args;
        const [login, dashC, line, ...more] = args;
        const mapped =
          proc.cmd === "/bin/bash" && login === "-l" && dashC === "-c" && line !== undefined && more.length === 0
            ? mapLine(ctx, sandboxId, line)
            : undefined;
        if (mapped) {
          await mapped.before();
          args = ["-l", "-c", mapped.line];
          if (mapped.recorded !== undefined) recordedArgs = ["-l", "-c", mapped.recorded];
        }
        const deadline = ctx.timeoutMs();
        const parsed = commandRequest.safeParse({
          cmd: `exec ${[proc.cmd, ...args].map(shellQuote).join(" ")}`,
          ...(proc.cwd ? { cwd: proc.cwd } : {}),
          env: { ...(await state.ready(sandboxId).then(() => state.env(sandboxId))), ...proc.envs },
          // A terminal always takes input, as in envd.
          stdin: size !== undefined || (req.stdin ?? false),
          background: true,
          ...(size ? { pty: { cols: size.cols, rows: size.rows } } : {}),
          ...(deadline === undefined ? {} : { timeout_s: Math.max(deadline, 1) / 1000 }),
        });
        if (!parsed.success)
          throw new ConnectError(parsed.error.issues[0]?.message ?? "invalid process", Code.InvalidArgument);
        command = registry.start(sandboxId, agent, parsed.data);
      } catch (err) {
        throw toConnectError(err);
      }
      const config = { cmd: proc.cmd, args: recordedArgs, envs: proc.envs, ...(proc.cwd ? { cwd: proc.cwd } : {}) };
      const tag = req.tag === undefined ? {} : { tag: req.tag };
      let pid: number | undefined;
      const onStarted = (started: number): E2bProcess => {
        pid = started;
        const process = { commandId: command.id, config, pty: size !== undefined, ...tag };
        state.addProcess(sandboxId, started, process);
        return process;
      };
      for await (const event of processEvents(command, ctx, size !== undefined, undefined, onStarted)) yield { event };
      // It ended (the stream carried its end event): forget its pid, unless a newer process has it.
      if (pid !== undefined && state.process(sandboxId, pid)?.commandId === command.id)
        state.dropProcess(sandboxId, pid);
    },

    async *connect(req, ctx) {
      const { pid, process, command } = await selected(ctx, req.process);
      yield { event: { event: { case: "start", value: { pid } } } };
      for await (const event of processEvents(command, ctx, process.pty, process, () => process)) yield { event };
    },

    list: async (_req, ctx) => {
      checkRpcUser(ctx);
      const sandboxId = sandboxOf(ctx);
      await state.ready(sandboxId);
      const processes = [];
      for (const [pid, process] of state.listProcesses(sandboxId)) {
        const command = registry.get(sandboxId, process.commandId);
        // One from before a restart is not listed (its output and end are lost) but stays known,
        // so SendSignal can still reach it in the guest.
        if (!command) continue;
        if (command.finished) state.dropProcess(sandboxId, pid);
        else
          processes.push({ pid, config: process.config, ...(process.tag === undefined ? {} : { tag: process.tag }) });
      }
      return { processes };
    },

    sendSignal: async (req, ctx) => {
      const signal = SIGNALS[req.signal];
      if (!signal) throw new ConnectError("signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM", Code.InvalidArgument);
      const sandboxId = sandboxOf(ctx);
      const before = await fromBeforeRestart(ctx, req.process);
      if (before) {
        let signalled: boolean;
        try {
          signalled = await signalBeforeRestart(sandboxId, before.pid, signal);
        } catch (err) {
          throw toConnectError(err);
        }
        if (!signalled || signal === "SIGKILL") state.dropProcess(sandboxId, before.pid);
        if (!signalled) throw new ConnectError(`process ${before.pid} not found`, Code.NotFound);
        return {};
      }
      const { pid, command } = await selected(ctx, req.process);
      state.markSignalled(sandboxId, pid, signal);
      command.signal(signal);
      return {};
    },

    sendInput: async (req, ctx) => {
      const { process, command } = await selected(ctx, req.process);
      const input = req.input?.input;
      if (input?.case === "pty" && !process.pty)
        throw new ConnectError("process has no terminal: send its input as stdin", Code.InvalidArgument);
      if (input?.case === "stdin" || input?.case === "pty") command.stdin(Buffer.from(input.value), false);
      return {};
    },

    update: async (req, ctx) => {
      const { process, command } = await selected(ctx, req.process);
      const size = req.pty?.size;
      if (!size) return {};
      if (!process.pty) throw new ConnectError("process has no terminal to resize", Code.InvalidArgument);
      const parsed = ptySize.safeParse({ cols: size.cols, rows: size.rows });
      if (!parsed.success)
        throw new ConnectError(parsed.error.issues[0]?.message ?? "invalid size", Code.InvalidArgument);
      command.resize(parsed.data.cols, parsed.data.rows);
      return {};
    },

    closeStdin: async (req, ctx) => {
      const { command } = await selected(ctx, req.process);
      command.stdin(Buffer.alloc(0), true);
      return {};
    },
  };
}
