import { Sandbox } from "@bothy/sdk";
import { CONNECTION_FLAGS, connection, parse } from "../args/parse.ts";
import type { Command } from "../command.ts";
import { exitStatus } from "./exec.ts";

const USAGE = `usage: bothy shell ID [--cmd CMD] [--cwd DIR]

Opens an interactive shell in the sandbox on a terminal the size of this one (kept in step
when this window resizes). Exit the shell (exit, or Ctrl-D) to return; the exit status is the
shell's.

  --cmd CMD   run CMD on the terminal instead of a login shell
`;

export const shellCommand: Command = {
  name: "shell",
  summary: "interactive shell in a sandbox",
  usage: USAGE,
  async run(args) {
    const { values, positionals } = parse(
      args,
      { ...CONNECTION_FLAGS, cmd: { type: "string" }, cwd: { type: "string" } },
      { min: 1, max: 1, names: "sandbox ID" },
    );
    if (values.help) {
      process.stdout.write(USAGE);
      return 0;
    }
    const sandbox = await Sandbox.connect(positionals[0] ?? "", connection(values));
    const { stdin, stdout } = process;
    const size = (): { cols: number; rows: number } => ({ cols: stdout.columns || 80, rows: stdout.rows || 24 });
    const pty = await sandbox.pty.create({
      ...size(),
      onData: (data) => stdout.write(data),
      ...(values.cmd === undefined ? {} : { cmd: values.cmd }),
      ...(values.cwd === undefined ? {} : { cwd: values.cwd }),
      ...(process.env["TERM"] ? { env: { TERM: process.env["TERM"] } } : {}),
    });
    const raw = stdin.isTTY === true;
    if (raw) stdin.setRawMode(true);
    const onInput = (chunk: Buffer): void => {
      try {
        pty.sendStdin(chunk);
        // gVisor's terminal does not turn ^C and ^\ into signals; send them as a terminal would.
        if (chunk.includes(0x03)) void pty.kill("SIGINT").catch(() => undefined);
        if (chunk.includes(0x1c)) void pty.kill("SIGQUIT").catch(() => undefined);
      } catch {
        stdin.pause(); // the shell has ended
      }
    };
    const onResize = (): void => {
      try {
        pty.resize(size());
      } catch {
        // ended
      }
    };
    stdin.on("data", onInput);
    stdout.on("resize", onResize);
    process.on("SIGWINCH", onResize);
    try {
      const r = await pty.wait();
      return exitStatus(r.exitCode, r.signal);
    } finally {
      stdin.off("data", onInput);
      stdout.off("resize", onResize);
      process.off("SIGWINCH", onResize);
      if (raw) stdin.setRawMode(false);
      stdin.pause();
    }
  },
};
