import { constants } from "node:os";
import { Sandbox, type CommandHandle, type SignalName } from "@bothy/sdk";
import { CONNECTION_FLAGS, connection, intFlag, parse, UsageError } from "../args/parse.ts";
import type { Command } from "../command.ts";

const USAGE = `usage: bothy exec ID [options] -- CMD [ARG...]

Runs CMD in the sandbox, streams its stdout and stderr here, and exits with its exit code
(128+N when signal N ended it, 124 when --timeout ran out). One CMD argument is a shell line
("ls | wc -l"); several are quoted as separate words. Ctrl-C sends SIGINT to the command.

  --cwd DIR        working directory (default /workspace)
  -e, --env K=V    environment variable (repeatable)
  --timeout S      kill the command after S seconds
  -i, --stdin      pass this terminal's stdin to the command
  -d, --background start it in the background, print its command id and return
`;

/** Words after `--`: one is a shell line as typed, several are quoted so each stays one word. */
export function commandLine(words: string[]): string {
  if (words.length === 1) return words[0] ?? "";
  return words.map((w) => (/^[A-Za-z0-9_@%+=:,./-]+$/.test(w) ? w : `'${w.replace(/'/g, `'\\''`)}'`)).join(" ");
}

/** The status a shell would report: the code, or 128 + the signal's number. */
export function exitStatus(exitCode: number | null | undefined, signal: string | undefined): number {
  if (typeof exitCode === "number") return exitCode;
  const n = signal === undefined ? undefined : (constants.signals as Record<string, number>)[signal];
  return n === undefined ? 1 : 128 + n;
}

export const execCommand: Command = {
  name: "exec",
  summary: "run a command in a sandbox, streaming its output",
  usage: USAGE,
  async run(args) {
    const dash = args.indexOf("--");
    const words = dash < 0 ? [] : args.slice(dash + 1);
    const { values, positionals } = parse(
      dash < 0 ? args : args.slice(0, dash),
      {
        ...CONNECTION_FLAGS,
        cwd: { type: "string" },
        env: { type: "string", short: "e", multiple: true },
        timeout: { type: "string" },
        stdin: { type: "boolean", short: "i" },
        background: { type: "boolean", short: "d" },
      },
      { min: 1, max: 1, names: "sandbox ID" },
    );
    if (values.help) {
      process.stdout.write(USAGE);
      return 0;
    }
    if (words.length === 0) throw new UsageError("the command goes after --, e.g. bothy exec ID -- uname -a");
    const env: Record<string, string> = {};
    for (const kv of values.env ?? []) {
      const eq = kv.indexOf("=");
      if (eq <= 0) throw new UsageError(`--env takes NAME=VALUE, got "${kv}"`);
      env[kv.slice(0, eq)] = kv.slice(eq + 1);
    }
    const timeoutS = intFlag(values.timeout, "timeout");
    const sandbox = await Sandbox.connect(positionals[0] ?? "", connection(values));
    const handle = await sandbox.commands.start(commandLine(words), {
      ...(values.cwd === undefined ? {} : { cwd: values.cwd }),
      ...(Object.keys(env).length ? { env } : {}),
      ...(timeoutS === undefined ? {} : { timeoutS }),
      ...(values.stdin ? { stdin: true } : {}),
      ...(values.background ? { background: true } : {}),
      // A background command's output stays in the sandbox; `bothy logs ID CMD_ID` shows it.
      ...(values.background
        ? {}
        : {
            onOutput: (bytes: Uint8Array, stream: "stdout" | "stderr") =>
              (stream === "stdout" ? process.stdout : process.stderr).write(bytes),
          }),
      throwOnError: false,
    });
    if (values.background) {
      handle.disconnect();
      process.stdout.write(`${handle.commandId}\n`);
      return 0;
    }
    if (values.stdin) pipeStdin(handle);
    const forward = (signal: SignalName) => (): void => void handle.kill(signal).catch(() => undefined);
    const onInt = forward("SIGINT");
    const onTerm = forward("SIGTERM");
    process.on("SIGINT", onInt);
    process.on("SIGTERM", onTerm);
    try {
      const r = await handle.wait();
      return exitStatus(r.exitCode, r.signal);
    } catch (err) {
      if (err instanceof Error && "code" in err && err.code === "command_timeout") {
        process.stderr.write(`bothy exec: the command ran past --timeout ${timeoutS ?? ""}s and was killed\n`);
        return 124;
      }
      throw err;
    } finally {
      process.off("SIGINT", onInt);
      process.off("SIGTERM", onTerm);
      process.stdin.pause();
    }
  },
};

function pipeStdin(handle: CommandHandle): void {
  process.stdin.on("data", (chunk: Buffer) => {
    try {
      handle.sendStdin(chunk);
    } catch {
      process.stdin.pause(); // the command has ended; the rest of stdin has no reader
    }
  });
  process.stdin.on("end", () => {
    try {
      handle.closeStdin();
    } catch {
      // ended already
    }
  });
}
