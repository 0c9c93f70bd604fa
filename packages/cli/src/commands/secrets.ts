import { Secrets } from "@bothy/sdk";
import { connection, JSON_FLAG, UsageError } from "../args/parse.ts";
import { subcommandsCommand } from "../command.ts";
import { printJson, printList } from "../output.ts";

const USAGE = `usage: bothy secrets put NAME --host HOST... [--header NAME [--format 'Bearer {value}']] [--tenant ID] [--json] < value
       bothy secrets ls [--tenant ID] [--json]
       bothy secrets rm NAME... [--tenant ID] [--json]

The tenant's secrets vault (scope secrets). put reads the value from stdin (never from the
command line, where other users and shell history could see it); one trailing newline is
dropped. A sandbox created with --secret NAME sees a placeholder in $NAME (upper-cased); the
egress gateway swaps in the value on requests to the --host names only (exact, or *.example.com),
in the header the placeholder is in, or in --header (formatted by --format) on every request.
No command shows a value again.
`;

/** All of stdin; refuses a terminal, so a value is never typed where it is echoed. */
async function readValue(): Promise<string> {
  if (process.stdin.isTTY)
    throw new UsageError('pipe the value on stdin: printf %s "$TOKEN" | bothy secrets put NAME ...');
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  const value = Buffer.concat(chunks)
    .toString("utf8")
    .replace(/\r?\n$/, "");
  if (value.length === 0) throw new UsageError("the value on stdin is empty");
  return value;
}

export const secretsCommand = subcommandsCommand({
  name: "secrets",
  summary: "store, list and remove the vault's secrets",
  usage: USAGE,
  options: {
    ...JSON_FLAG,
    host: { type: "string", multiple: true },
    header: { type: "string" },
    format: { type: "string" },
    tenant: { type: "string" },
  },
  positionals: { min: 0, max: Infinity, names: "secret name" },
  async run(sub, { values, positionals }) {
    const conn = { ...connection(values), ...(values.tenant === undefined ? {} : { tenant: values.tenant }) };
    if (sub === "put") {
      const [name, ...extra] = positionals;
      if (name === undefined || extra.length > 0) throw new UsageError("put takes one secret name");
      if (!values.host?.length) throw new UsageError("put needs at least one --host");
      if (values.format !== undefined && values.header === undefined) throw new UsageError("--format needs --header");
      const inject =
        values.header === undefined
          ? undefined
          : { header: values.header, ...(values.format === undefined ? {} : { format: values.format }) };
      const info = await Secrets.put(name, await readValue(), {
        ...conn,
        hosts: values.host,
        ...(inject ? { inject } : {}),
      });
      if (values.json) printJson(info);
      else process.stdout.write(`${info.name}\n`);
      return 0;
    }
    if (sub === "ls" || sub === "list") {
      const secrets = await Secrets.list(conn);
      printList(values.json, "secrets", secrets, ["NAME", "TENANT", "HOSTS", "INJECT", "UPDATED"], (s) => [
        s.name,
        s.tenant,
        s.hosts.join(","),
        s.inject ? `${s.inject.header}: ${s.inject.format}` : "-",
        s.updated_at,
      ]);
      return 0;
    }
    if (sub === "rm" || sub === "delete") {
      if (positionals.length === 0) throw new UsageError("missing secret name");
      const removed = [];
      for (const name of positionals) removed.push(await Secrets.delete(name, conn));
      if (values.json) printJson({ secrets: removed });
      else for (const s of removed) process.stdout.write(`${s.name}\n`);
      return 0;
    }
    throw new UsageError(`unknown subcommand ${sub}`);
  },
});
