/**
 * Argument parsing for every command: node's `util.parseArgs` (strict), plus the flags all API
 * commands share (`--url`, `--api-key`, `--json`, `--help`). Usage errors are thrown as
 * UsageError, which `main` prints with the command's usage and exit status 2.
 */
import { parseArgs, type ParseArgsConfig } from "node:util";
import type { ConnectionOptions } from "@bothy/sdk";

export class UsageError extends Error {}

export type Options = NonNullable<ParseArgsConfig["options"]>;

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
  let parsed;
  try {
    parsed = parseArgs({ args, options, allowPositionals: true, strict: true });
  } catch (err) {
    throw new UsageError(
      err instanceof Error ? err.message.replace(/\. To specify a positional.*$/s, "") : String(err),
    );
  }
  const { positionals: pos } = parsed;
  if (!(parsed.values as { help?: boolean }).help) {
    if (pos.length < positionals.min) throw new UsageError(`missing ${positionals.names}`);
    if (pos.length > positionals.max) throw new UsageError(`unexpected argument ${pos[positionals.max] ?? ""}`);
  }
  return { values: parsed.values as Parsed<O>["values"], positionals: pos };
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
