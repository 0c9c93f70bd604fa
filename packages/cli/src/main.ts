#!/usr/bin/env node
import { useAdminKeyFile } from "./admin-key.ts";
import { API_USAGE, errorLine, runApiCommand } from "./api-commands.ts";

const USAGE = `usage: bothy <command>

  serve                         start the server (builds the seed template on first run)
  template build NAME [--force] build a template from templates/NAME/template.yaml
  template list                 list templates and whether they are built (also: template ls)
  mcp [--url URL] [--conversation ID]  the agent tools over MCP on stdio (relayed to URL/mcp)

${API_USAGE}

environment: BOTHY_HOME (default /var/lib/bothy), BOTHY_HOST, BOTHY_PORT, BOTHY_TEMPLATES_DIR;
BOTHY_API_KEY (default: $BOTHY_HOME/admin.key when readable)`;

async function main(argv: string[]): Promise<number> {
  const [cmd, sub, ...rest] = argv;
  if (cmd !== "serve") useAdminKeyFile();
  // The server-side commands load the server's code only when used: the API commands start fast,
  // and run where only the CLI is installed.
  if (cmd === "serve")
    return (await serverSide(cmd, () => import("./commands/serve.ts"))).serve([sub ?? "", ...rest].filter(Boolean));
  if (cmd === "template" && sub === "build")
    return (await serverSide(cmd, () => import("./commands/template-build.ts"))).templateBuild(rest);
  if (cmd === "template" && (sub === "list" || sub === "ls"))
    return (await serverSide(cmd, () => import("./commands/template-build.ts"))).templateList(rest);
  if (cmd === "mcp")
    return (await serverSide(cmd, () => import("./commands/mcp.ts"))).mcp([sub ?? "", ...rest].filter(Boolean));
  const code = await runApiCommand(argv);
  if (code !== undefined) return code;
  process.stderr.write(`${USAGE}\n`);
  return cmd === undefined || cmd === "help" || cmd === "--help" ? 0 : 2;
}

/**
 * Loads a command that runs the server's or the tools' code. Those packages are not published: a
 * CLI installed from its package has the API commands only, and says so instead of a module error.
 */
async function serverSide<T>(cmd: string, load: () => Promise<T>): Promise<T> {
  try {
    return await load();
  } catch (err) {
    const missing =
      err instanceof Error &&
      "code" in err &&
      err.code === "ERR_MODULE_NOT_FOUND" &&
      /'@bothy\/(server|tools)'/.test(err.message);
    if (!missing) throw err;
    throw new Error(
      `\`bothy ${cmd}\` runs the server's code, which this installed CLI does not carry: run it from a checkout of ` +
        `the bothy repository (npm ci, then node packages/cli/bin/bothy.js ${cmd}); the other commands work against ` +
        `any server (BOTHY_URL)`,
    );
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(errorLine(err));
    process.exit(1);
  },
);
