import { UiLinks } from "@bothy/sdk";
import { CONNECTION_FLAGS, connection, intFlag, JSON_FLAG, parse } from "../args/parse.ts";
import type { Command } from "../command.ts";
import { printJson } from "../output.ts";

const USAGE = `usage: bothy ui-link [--ttl SECONDS] [--json]

Prints a one-time link that signs a browser in to the dashboard (/ui) as this key, without
pasting the key: the link holds a random token (never the key), works once, for --ttl seconds
(default 300, at most 3600), and not at all once the key is revoked. Open it soon; anyone
holding it before you signs in as you.
`;

export const uiLinkCommand: Command = {
  name: "ui-link",
  summary: "print a one-time sign-in link for the dashboard",
  usage: USAGE,
  async run(args) {
    const { values } = parse(args, { ...CONNECTION_FLAGS, ...JSON_FLAG, ttl: { type: "string" } } as const, {
      min: 0,
      max: 0,
      names: "nothing",
    });
    if (values.help) {
      process.stdout.write(USAGE);
      return 0;
    }
    const ttlS = intFlag(values.ttl, "ttl");
    const link = await UiLinks.create({ ...connection(values), ...(ttlS === undefined ? {} : { ttlS }) });
    if (values.json) printJson(link);
    else process.stdout.write(`${link.url}\n`);
    return 0;
  },
};
