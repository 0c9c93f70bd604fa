#!/usr/bin/env node
import { mcp } from "./commands/mcp.ts";
import { serve } from "./commands/serve.ts";
import { templateBuild, templateList } from "./commands/template-build.ts";

const USAGE = `usage: bothy <command>

  serve                         start the server (builds the seed template on first run)
  template build NAME [--force] build a template from templates/NAME/template.yaml
  template list                 list templates and whether they are built
  mcp [--url URL] [--conversation ID]  the agent tools over MCP on stdio (relayed to URL/mcp)

environment: BOTHY_HOME (default /var/lib/bothy), BOTHY_HOST, BOTHY_PORT, BOTHY_TEMPLATES_DIR`;

async function main(argv: string[]): Promise<number> {
  const [cmd, sub, ...rest] = argv;
  if (cmd === "serve") return serve([sub ?? "", ...rest].filter(Boolean));
  if (cmd === "template" && sub === "build") return templateBuild(rest);
  if (cmd === "template" && sub === "list") return templateList(rest);
  if (cmd === "mcp") return mcp([sub ?? "", ...rest].filter(Boolean));
  process.stderr.write(`${USAGE}\n`);
  return cmd === undefined || cmd === "help" || cmd === "--help" ? 0 : 2;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`bothy: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  },
);
