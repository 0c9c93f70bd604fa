import { Sandbox } from "@bothy/sdk";
import { CONNECTION_FLAGS, connection, JSON_FLAG, parse } from "../args/parse.ts";
import type { Command } from "../command.ts";
import { printJson, printTable, SANDBOX_HEADER, sandboxRow } from "../output.ts";

const USAGE = `usage: bothy ls [--json] [--quiet]

Lists the live sandboxes (creating, running, paused, deleting).

  -q, --quiet   ids only, one a line
`;

export const lsCommand: Command = {
  name: "ls",
  summary: "list live sandboxes",
  usage: USAGE,
  async run(args) {
    const { values } = parse(
      args,
      { ...CONNECTION_FLAGS, ...JSON_FLAG, quiet: { type: "boolean", short: "q" } },
      { min: 0, max: 0, names: "" },
    );
    if (values.help) {
      process.stdout.write(USAGE);
      return 0;
    }
    const sandboxes = await Sandbox.list(connection(values));
    if (values.json) printJson({ sandboxes });
    else if (values.quiet) for (const s of sandboxes) process.stdout.write(`${s.sandbox_id}\n`);
    else
      printTable(
        SANDBOX_HEADER,
        sandboxes.map((s) => sandboxRow(s)),
      );
    return 0;
  },
};
