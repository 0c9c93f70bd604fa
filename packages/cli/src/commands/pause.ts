import { Sandbox } from "@bothy/sdk";
import { CONNECTION_FLAGS, connection, JSON_FLAG, parse } from "../args/parse.ts";
import type { Command } from "../command.ts";
import { printJson } from "../output.ts";

export function stateChangeCommand(name: "pause" | "resume", summary: string, usage: string): Command {
  return {
    name,
    summary,
    usage,
    async run(args) {
      const { values, positionals } = parse(
        args,
        { ...CONNECTION_FLAGS, ...JSON_FLAG },
        { min: 1, max: 1, names: "sandbox ID" },
      );
      if (values.help) {
        process.stdout.write(usage);
        return 0;
      }
      const sandbox = await Sandbox.connect(positionals[0] ?? "", connection(values));
      const info = name === "pause" ? await sandbox.pause() : await sandbox.resume();
      if (values.json) printJson(info);
      else process.stdout.write(`${info.sandbox_id} ${info.state}\n`);
      return 0;
    },
  };
}

export const pauseCommand = stateChangeCommand(
  "pause",
  "save a sandbox's memory to disk and stop it (QEMU)",
  `usage: bothy pause ID [--json]

Saves the sandbox's memory to disk and ends its VM; files and background processes survive.
QEMU driver only (a gVisor sandbox answers "not supported"). A command or file call resumes it.
`,
);
