import { Sandbox } from "@bothy/sdk";
import { CONNECTION_FLAGS, connection, JSON_FLAG, parse, type Options, type Parsed } from "./args/parse.ts";

/** One CLI command: its usage text and what it does; `run` answers the process exit status. */
export interface Command {
  /** How it is typed after `bothy`, e.g. "template build". */
  name: string;
  /** One line for `bothy --help`. */
  summary: string;
  usage: string;
  run(args: string[]): Promise<number>;
}

/**
 * A command with subcommands (`bothy keys ls --json`): what follows the subcommand is parsed with
 * the connection flags and `options`. No subcommand prints the usage with status 2, `--help` with 0.
 */
export function subcommandsCommand<O extends Options>(spec: {
  name: string;
  summary: string;
  usage: string;
  options: O;
  positionals: { min: number; max: number; names: string };
  run(sub: string, parsed: Parsed<typeof CONNECTION_FLAGS & O>): Promise<number>;
}): Command {
  return {
    name: spec.name,
    summary: spec.summary,
    usage: spec.usage,
    async run(args) {
      const [sub, ...rest] = args;
      const parsed = parse(rest, { ...CONNECTION_FLAGS, ...spec.options }, spec.positionals);
      if (parsed.values.help || sub === undefined || sub === "--help" || sub === "-h") {
        process.stdout.write(spec.usage);
        return sub === undefined ? 2 : 0;
      }
      return spec.run(sub, parsed);
    },
  };
}

/** A command on one sandbox (`bothy info ID [--json]`): connects to it and hands it to `act`. */
export function sandboxCommand(
  name: string,
  summary: string,
  usage: string,
  act: (sandbox: Sandbox, json: boolean) => Promise<void>,
): Command {
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
      await act(await Sandbox.connect(positionals[0] ?? "", connection(values)), values.json === true);
      return 0;
    },
  };
}
