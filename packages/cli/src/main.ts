#!/usr/bin/env node
import { API_USAGE, errorLine, runApiCommand } from "./api-commands.ts";
import { mcp } from "./commands/mcp.ts";
import { serve } from "./commands/serve.ts";
import { templateBuild, templateList } from "./commands/template-build.ts";

const USAGE = `usage: bothy <command>

  serve                         start the server (builds the seed template on first run)
  template build NAME [--force] build a template from templates/NAME/template.yaml
  template list                 list templates and whether they are built (also: template ls)
  mcp [--url URL] [--conversation ID]  the agent tools over MCP on stdio (relayed to URL/mcp)

${API_USAGE}

environment: BOTHY_HOME (default /var/lib/bothy), BOTHY_HOST, BOTHY_PORT, BOTHY_TEMPLATES_DIR`;

async function main(argv: string[]): Promise<number> {
  const [cmd, sub, ...rest] = argv;
  if (cmd === "serve") return serve([sub ?? "", ...rest].filter(Boolean));
  if (cmd === "template" && sub === "build") return templateBuild(rest);
  if (cmd === "template" && (sub === "list" || sub === "ls")) return templateList(rest);
  if (cmd === "mcp") return mcp([sub ?? "", ...rest].filter(Boolean));
  const code = await runApiCommand(argv);
  if (code !== undefined) return code;
  process.stderr.write(`${USAGE}\n`);
  return cmd === undefined || cmd === "help" || cmd === "--help" ? 0 : 2;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(errorLine(err));
    process.exit(1);
  },
);
