import { Sandbox } from "@bothy/sdk";
import { CONNECTION_FLAGS, connection, JSON_FLAG, parse } from "../args/parse.ts";
import type { Command } from "../command.ts";
import { printJson } from "../output.ts";

const USAGE = `usage: bothy rm ID... [--wait] [--json]

Deletes sandboxes and everything in them. Deleting one twice is fine; an id that never
existed is an error (exit status 1, after the others are deleted). It returns once each
sandbox is deleting and unreachable; the host finishes in the background.

  --wait   return once each sandbox is deleted (its teardown on the host ended)
`;

export const rmCommand: Command = {
  name: "rm",
  summary: "delete sandboxes",
  usage: USAGE,
  async run(args) {
    const { values, positionals } = parse(
      args,
      { ...CONNECTION_FLAGS, ...JSON_FLAG, wait: { type: "boolean" } },
      { min: 1, max: Infinity, names: "sandbox ID" },
    );
    if (values.help) {
      process.stdout.write(USAGE);
      return 0;
    }
    const results = await Promise.all(
      positionals.map(async (id) => ({
        sandbox_id: id,
        deleted: await Sandbox.kill(id, { ...connection(values), wait: values.wait ?? false }),
      })),
    );
    if (values.json) printJson({ results });
    for (const r of results) {
      if (!r.deleted) process.stderr.write(`bothy rm: no sandbox ${r.sandbox_id}\n`);
      else if (!values.json) process.stdout.write(`${r.sandbox_id}\n`);
    }
    return results.every((r) => r.deleted) ? 0 : 1;
  },
};
