import { Sandbox, Snapshot } from "@bothy/sdk";
import { connection, JSON_FLAG, UsageError } from "../args/parse.ts";
import { subcommandsCommand } from "../command.ts";
import { printJson, printList } from "../output.ts";

const USAGE = `usage: bothy snapshot create SANDBOX_ID [--name NAME] [--memory] [--json]
       bothy snapshot ls [--json]
       bothy snapshot rm REF... [--json]

Snapshots keep what a sandbox wrote over its template (running or asleep; it is frozen only for
the copy). Start sandboxes from one with bothy create --snapshot REF, or snapshot and start several
at once with bothy fork. REF is a snapshot's id (snap_...) or name. rm refuses a snapshot a live
sandbox started from. The tenant's max_storage_mib quota bounds snapshots and volumes together.

  --memory   also keep memory and processes, which every sandbox started from it resumes (QEMU;
             gVisor refuses it); ls shows which snapshots kept memory
`;

export const snapshotCommand = subcommandsCommand({
  name: "snapshot",
  summary: "snapshot a sandbox's files, list and remove snapshots",
  usage: USAGE,
  options: { ...JSON_FLAG, name: { type: "string" }, memory: { type: "boolean" } },
  positionals: { min: 0, max: Infinity, names: "sandbox id or snapshot" },
  async run(sub, { values, positionals }) {
    const conn = connection(values);
    if (sub === "create") {
      const [id, ...extra] = positionals;
      if (id === undefined || extra.length > 0) throw new UsageError("create takes one sandbox id");
      const sandbox = await Sandbox.connect(id, conn);
      const info = await sandbox.snapshot({
        ...(values.name === undefined ? {} : { name: values.name }),
        ...(values.memory === true ? { memory: true } : {}),
      });
      if (values.json) printJson(info);
      else process.stdout.write(`${info.snapshot_id}\n`);
      return 0;
    }
    if (sub === "ls" || sub === "list") {
      const snapshots = await Snapshot.list(conn);
      printList(
        values.json,
        "snapshots",
        snapshots,
        ["ID", "NAME", "SOURCE", "TEMPLATE", "BYTES", "MEMORY", "USED_BY", "CREATED"],
        (s) => [
          s.snapshot_id,
          s.name ?? "-",
          s.source_sandbox_id,
          s.template,
          String(s.bytes),
          s.memory ? "yes" : "no",
          s.used_by.join(",") || "-",
          s.created_at,
        ],
      );
      return 0;
    }
    if (sub === "rm" || sub === "delete") {
      if (positionals.length === 0) throw new UsageError("missing snapshot id or name");
      for (const ref of positionals) await Snapshot.delete(ref, conn);
      if (values.json) printJson({ deleted: positionals });
      else for (const ref of positionals) process.stdout.write(`${ref}\n`);
      return 0;
    }
    throw new UsageError(`unknown subcommand "${sub}"`);
  },
});
