import { ApiKeys } from "@bothy/sdk";
import { connection, intFlag, JSON_FLAG, UsageError } from "../args/parse.ts";
import { subcommandsCommand } from "../command.ts";
import { printJson, printList } from "../output.ts";

const USAGE = `usage: bothy keys create [--name NAME] [--scope SCOPE]... [--tenant ID] [--expires-in SECONDS] [--json]
       bothy keys ls [--json]
       bothy keys revoke KEY_ID... [--json]

API keys (scope keys:manage). create prints the new key once: keep it, it is not stored.
Scopes: sandboxes:read sandboxes:write files corpus conversations keys:manage admin;
default: those of the first five the calling key holds. A key mints only within its own scopes.
`;

export const keysCommand = subcommandsCommand({
  name: "keys",
  summary: "create, list and revoke API keys",
  usage: USAGE,
  options: {
    ...JSON_FLAG,
    name: { type: "string" },
    scope: { type: "string", multiple: true },
    tenant: { type: "string" },
    "expires-in": { type: "string" },
  },
  positionals: { min: 0, max: Infinity, names: "key id" },
  async run(sub, { values, positionals }) {
    const conn = connection(values);
    if (sub === "create") {
      const expiresInS = intFlag(values["expires-in"], "expires-in");
      const made = await ApiKeys.create({
        ...conn,
        ...(values.name === undefined ? {} : { name: values.name }),
        ...(values.scope === undefined ? {} : { scopes: values.scope }),
        ...(values.tenant === undefined ? {} : { tenant: values.tenant }),
        ...(expiresInS === undefined ? {} : { expiresInS }),
      });
      if (values.json) printJson(made);
      else {
        process.stdout.write(`${made.key}\n`);
        process.stderr.write(`key ${made.key_id} (tenant ${made.tenant}, ${made.scopes.join(" ")}); shown only now\n`);
      }
      return 0;
    }
    if (sub === "ls" || sub === "list") {
      const keys = await ApiKeys.list(conn);
      printList(
        values.json,
        "keys",
        keys,
        ["KEY ID", "TENANT", "NAME", "KEY", "SCOPES", "EXPIRES", "REVOKED", "LAST USED"],
        (k) => [
          k.key_id,
          k.tenant,
          k.name,
          k.display,
          k.scopes.join(","),
          k.expires_at ?? "-",
          k.revoked_at ?? "-",
          k.last_used_at ?? "-",
        ],
      );
      return 0;
    }
    if (sub === "revoke") {
      if (positionals.length === 0) throw new UsageError("missing key id");
      const revoked = [];
      for (const id of positionals) revoked.push(await ApiKeys.revoke(id, conn));
      if (values.json) printJson({ keys: revoked });
      else for (const k of revoked) process.stdout.write(`${k.key_id}\n`);
      return 0;
    }
    throw new UsageError(`unknown subcommand ${sub}`);
  },
});
