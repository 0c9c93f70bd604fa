/**
 * Argument parsing for every command, with commander: each command declares its options as data
 * (name, string or boolean, a short letter, repeatable), plus the flags all API commands share
 * (`--url`, `--api-key`, `--json`, `--help`); unknown options, a missing value and a wrong count
 * of arguments are refused. Usage errors are thrown as UsageError, which the command's runner
 * prints with the command's usage and exit status 2.
 */
import { Command, CommanderError, Option } from "commander";
import type { ConnectionOptions } from "@bothy/sdk";

export class UsageError extends Error {}

/** One option: a string (its value follows) or a boolean flag; `multiple` collects every value given. */
export interface OptionSpec {
  type: "string" | "boolean";
  short?: string;
  multiple?: boolean;
}

export type Options = Record<string, OptionSpec>;

/** Flags every API command takes. */
export const CONNECTION_FLAGS = {
  url: { type: "string" },
  "api-key": { type: "string" },
  help: { type: "boolean", short: "h" },
} as const satisfies Options;

export const JSON_FLAG = { json: { type: "boolean" } } as const satisfies Options;

export interface Parsed<O extends Options> {
  values: {
    [K in keyof O]?: O[K]["type"] extends "boolean" ? boolean : O[K] extends { multiple: true } ? string[] : string;
  };
  positionals: string[];
}

export function parse<O extends Options>(
  args: string[],
  options: O,
  positionals: { min: number; max: number; names: string },
): Parsed<O> {
  const parser = new Command()
    .exitOverride()
    .configureOutput({ writeOut: () => undefined, writeErr: () => undefined, outputError: () => undefined })
    .helpOption(false)
    .allowExcessArguments()
    .argument("[args...]");
  const attribute = new Map<string, Option>();
  for (const [name, spec] of Object.entries(options)) {
    const option = new Option(
      `${spec.short ? `-${spec.short}, ` : ""}--${name}${spec.type === "string" ? " <value>" : ""}`,
    );
    if (spec.multiple)
      option.argParser((value: string, previous: string[] | undefined) => [...(previous ?? []), value]);
    // `--no-internet` is a flag of its own here, not commander's negation of an `--internet`.
    if (name.startsWith("no-")) option.default(undefined);
    parser.addOption(option);
    attribute.set(name, option);
  }
  try {
    parser.parse(args, { from: "user" });
  } catch (err) {
    if (err instanceof CommanderError) {
      const message = err.message.replace(/^error: /, "");
      throw new UsageError(`${message.charAt(0).toUpperCase()}${message.slice(1)}`);
    }
    throw err;
  }
  const values: Record<string, unknown> = {};
  for (const [name, option] of attribute) {
    const value: unknown = parser.getOptionValue(option.attributeName());
    if (name.startsWith("no-")) {
      if (value === false) values[name] = true;
    } else if (value !== undefined) values[name] = value;
  }
  const pos = parser.args;
  if (!values["help"]) {
    if (pos.length < positionals.min) throw new UsageError(`missing ${positionals.names}`);
    if (pos.length > positionals.max) throw new UsageError(`unexpected argument ${pos[positionals.max] ?? ""}`);
  }
  return { values: values as Parsed<O>["values"], positionals: pos };
}

/** `--url` / `--api-key` over BOTHY_URL / BOTHY_API_KEY (the SDK reads those itself). */
export function connection(values: {
  url?: string | boolean | string[];
  "api-key"?: string | boolean | string[];
}): ConnectionOptions {
  return {
    ...(typeof values.url === "string" ? { baseUrl: values.url } : {}),
    ...(typeof values["api-key"] === "string" ? { apiKey: values["api-key"] } : {}),
  };
}

/** A positive integer flag, or undefined when absent. */
export function intFlag(value: string | undefined, name: string): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n <= 0) throw new UsageError(`--${name} takes a positive whole number, got "${value}"`);
  return n;
}
