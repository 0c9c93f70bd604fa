import { Volume } from "@bothy/sdk";
import { connection, intFlag, JSON_FLAG, UsageError } from "../args/parse.ts";
import { subcommandsCommand } from "../command.ts";
import { printJson, printList } from "../output.ts";

const USAGE = `usage: bothy volume create NAME --size MIB [--json]
       bothy volume ls [--json]
       bothy volume rm NAME... [--json]

Volumes: ext4 file systems that outlive sandboxes. Mount one with
bothy create --volume NAME:/PATH (read-write, one sandbox at a time) or NAME:/PATH:ro (any number).
rm refuses a volume a live sandbox mounts. The tenant's max_storage_mib quota bounds their total size.
`;

export const volumeCommand = subcommandsCommand({
  name: "volume",
  summary: "create, list and remove volumes",
  usage: USAGE,
  options: { ...JSON_FLAG, size: { type: "string" } },
  positionals: { min: 0, max: Infinity, names: "volume name" },
  async run(sub, { values, positionals }) {
    const conn = connection(values);
    if (sub === "create") {
      const [name, ...extra] = positionals;
      if (name === undefined || extra.length > 0) throw new UsageError("create takes one volume name");
      const size = intFlag(values.size, "size");
      if (size === undefined) throw new UsageError("create needs --size MIB");
      const info = await Volume.create(name, size, conn);
      if (values.json) printJson(info);
      else process.stdout.write(`${info.name}\n`);
      return 0;
    }
    if (sub === "ls" || sub === "list") {
      const volumes = await Volume.list(conn);
      printList(values.json, "volumes", volumes, ["NAME", "SIZE_MIB", "MOUNTED_BY", "CREATED"], (v) => [
        v.name,
        String(v.size_mib),
        v.mounted_by.map((m) => `${m.sandbox_id}:${m.path}${m.read_only ? ":ro" : ""}`).join(",") || "-",
        v.created_at,
      ]);
      return 0;
    }
    if (sub === "rm" || sub === "delete") {
      if (positionals.length === 0) throw new UsageError("missing volume name");
      for (const name of positionals) await Volume.delete(name, conn);
      if (values.json) printJson({ deleted: positionals });
      else for (const name of positionals) process.stdout.write(`${name}\n`);
      return 0;
    }
    throw new UsageError(`unknown subcommand "${sub}"`);
  },
});
