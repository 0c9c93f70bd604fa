import { Sandbox } from "@bothy/sdk";
import { CONNECTION_FLAGS, connection, JSON_FLAG, parse } from "../args/parse.ts";
import type { Command } from "../command.ts";
import { printJson, printSandbox } from "../output.ts";

const USAGE = `usage: bothy info ID [--json]

Shows one sandbox (also after it was deleted).
`;

export const infoCommand: Command = {
  name: "info",
  summary: "show one sandbox",
  usage: USAGE,
  async run(args) {
    const { values, positionals } = parse(
      args,
      { ...CONNECTION_FLAGS, ...JSON_FLAG },
      { min: 1, max: 1, names: "sandbox ID" },
    );
    if (values.help) {
      process.stdout.write(USAGE);
      return 0;
    }
    const sandbox = await Sandbox.connect(positionals[0] ?? "", connection(values));
    if (values.json) printJson(sandbox.info);
    else printSandbox(sandbox.info);
    return 0;
  },
};
