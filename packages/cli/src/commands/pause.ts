import { sandboxCommand, type Command } from "../command.ts";
import { printJson } from "../output.ts";

export function stateChangeCommand(name: "pause" | "resume", summary: string, usage: string): Command {
  return sandboxCommand(name, summary, usage, async (sandbox, json) => {
    const info = name === "pause" ? await sandbox.pause() : await sandbox.resume();
    if (json) printJson(info);
    else process.stdout.write(`${info.sandbox_id} ${info.state}\n`);
  });
}

export const pauseCommand = stateChangeCommand(
  "pause",
  "save a sandbox's memory to disk and stop it (QEMU)",
  `usage: bothy pause ID [--json]

Saves the sandbox's memory to disk and ends its VM; files and background processes survive.
QEMU driver only (a gVisor sandbox answers "not supported"). A command or file call resumes it.
`,
);
