import { sandboxCommand } from "../command.ts";
import { printJson, printSandbox } from "../output.ts";

export const infoCommand = sandboxCommand(
  "info",
  "show one sandbox",
  `usage: bothy info ID [--json]

Shows one sandbox (also after it was deleted).
`,
  async (sandbox, json) => {
    if (json) printJson(sandbox.info);
    else printSandbox(sandbox.info);
  },
);
