#!/usr/bin/env node
import { Command, CommanderError, type Help } from "commander";
import { useAdminKeyFile } from "./admin-key.ts";
import { API_COMMANDS, API_FOOTER, errorLine, runApiCommand } from "./api-commands.ts";

const FOOTER = `${API_FOOTER}

environment: BOTHY_HOME (default /var/lib/bothy), BOTHY_HOST, BOTHY_PORT, BOTHY_TEMPLATES_DIR;
BOTHY_API_KEY (default: $BOTHY_HOME/admin.key when readable)`;

/**
 * The `bothy` program: one commander command per CLI command, each handing the words after its
 * name, exactly as typed (`--` included: exec splits its command line there), to the command's
 * own options parser (args/parse.ts), and the overview `bothy --help` prints, made by commander
 * from the commands' names and summaries. Every command's action sets the exit status.
 */
function program(argv: string[], exit: { code: number }): Command {
  const root = new Command("bothy")
    .exitOverride()
    .configureOutput({ writeOut: () => undefined, writeErr: () => undefined, outputError: () => undefined })
    .helpOption(false)
    .addHelpCommand(false)
    .configureHelp({ formatHelp: overview });
  /** A command whose arguments, options included, go as typed to `run`. */
  const add = (parent: Command, name: string, summary: string, run: (args: string[]) => Promise<number>): Command =>
    parent
      .command(name)
      .description(summary)
      .helpOption(false)
      .allowUnknownOption()
      .allowExcessArguments()
      .argument("[args...]")
      .action(async () => {
        exit.code = await run(argv.slice(parent === root ? 1 : 2));
      });
  // The server-side commands load the server's code only when used: the API commands start fast,
  // and run where only the CLI is installed.
  add(root, "serve", "start the server (builds the seed template on first run)", async (args) =>
    (await serverSide("serve", () => import("./commands/serve.ts"))).serve(args),
  );
  const template = root
    .command("template")
    .description("build and list templates")
    .helpOption(false)
    .addHelpCommand(false);
  const build = add(template, "build", "build a template from templates/NAME/template.yaml", async (args) =>
    (await serverSide("template", () => import("./commands/template-build.ts"))).templateBuild(args),
  );
  ARGS.add(build.usage("NAME [--force]"));
  add(template, "list", "list templates and whether they are built", async (args) =>
    (await serverSide("template", () => import("./commands/template-build.ts"))).templateList(args),
  ).alias("ls");
  const mcp = add(root, "mcp", "the agent tools over MCP on stdio (relayed to URL/mcp)", async (args) =>
    (await serverSide("mcp", () => import("./commands/mcp.ts"))).mcp(args),
  );
  ARGS.add(mcp.usage("[--url URL] [--conversation ID]"));
  for (const command of API_COMMANDS) add(root, command.name, command.summary, (args) => runApiCommand(command, args));
  return root;
}

/** The commands whose usage names their arguments in the overview. */
const ARGS = new WeakSet<Command>();

/** The server-side commands, listed first in the overview, apart from the API commands. */
const SERVER_SIDE = new Set(["serve", "template", "mcp"]);

/**
 * `bothy --help`: the server-side commands, then the API commands, one a line with its arguments
 * (where it names them) and summary (with its aliases), then where the API commands connect.
 */
function overview(cmd: Command, helper: Help): string {
  const line = (name: string, c: Command): string => {
    const args = ARGS.has(c) ? ` ${c.usage()}` : "";
    const term = `${name}${args}`;
    const aliases = c.aliases().map((a) => name.replace(/\S+$/, a));
    const summary = `${helper.subcommandDescription(c)}${aliases.length ? ` (also: ${aliases.join(", ")})` : ""}`;
    return `  ${term.length < 30 ? term.padEnd(30) : `${term}  `}${summary}`;
  };
  const lines = (group: Command[]): string[] =>
    group.flatMap((c) =>
      c.commands.length > 0 ? c.commands.map((sub) => line(`${c.name()} ${sub.name()}`, sub)) : [line(c.name(), c)],
    );
  const commands = helper.visibleCommands(cmd);
  const server = lines(commands.filter((c) => SERVER_SIDE.has(c.name())));
  const api = lines(commands.filter((c) => !SERVER_SIDE.has(c.name())));
  return `usage: bothy <command>\n\n${server.join("\n")}\n\n${api.join("\n")}\n  (bothy COMMAND --help for its options)\n\n${FOOTER}\n`;
}

async function main(argv: string[]): Promise<number> {
  const [cmd] = argv;
  if (cmd !== "serve") useAdminKeyFile();
  const exit = { code: 0 };
  const bothy = program(argv, exit);
  try {
    if (cmd === undefined || cmd === "help" || cmd === "--help") {
      process.stderr.write(bothy.helpInformation());
      return 0;
    }
    await bothy.parseAsync(argv, { from: "user" });
    return exit.code;
  } catch (err) {
    // No such command (or `template` without build or list): the overview, as a usage error.
    if (!(err instanceof CommanderError)) throw err;
    process.stderr.write(bothy.helpInformation());
    return 2;
  }
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
