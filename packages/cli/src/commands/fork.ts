import { Sandbox } from "@bothy/sdk";
import { CONNECTION_FLAGS, connection, intFlag, JSON_FLAG, parse, UsageError } from "../args/parse.ts";
import type { Command } from "../command.ts";
import { printJson } from "../output.ts";

const USAGE = `usage: bothy fork SANDBOX_ID --count N [--name NAME] [--memory] [--timeout S] [--idempotency-key KEY] [--json]

Snapshots the sandbox and starts N sandboxes from the snapshot, each with its own identity
(hostname, machine id, address); prints the snapshot's id, then each new sandbox's id. All or
none are made. A child never changes its parent or its siblings.

  --count N         how many sandboxes (1-20)
  --name NAME       a name for the snapshot
  --memory          keep memory and processes: each child resumes the running processes (QEMU;
                    gVisor refuses it)
  --timeout S       delete each child S seconds after it starts (default: the server's)
  --idempotency-key KEY   the same key again answers the same snapshot and children
`;

export const forkCommand: Command = {
  name: "fork",
  summary: "snapshot a sandbox and start N copies of it",
  usage: USAGE,
  async run(args) {
    const { values, positionals } = parse(
      args,
      {
        ...CONNECTION_FLAGS,
        ...JSON_FLAG,
        count: { type: "string" },
        name: { type: "string" },
        memory: { type: "boolean" },
        timeout: { type: "string" },
        "idempotency-key": { type: "string" },
      },
      { min: 1, max: 1, names: "sandbox ID" },
    );
    if (values.help) {
      process.stdout.write(USAGE);
      return 0;
    }
    const count = intFlag(values.count, "count");
    if (count === undefined) throw new UsageError("fork needs --count N");
    const timeoutS = intFlag(values.timeout, "timeout");
    const parent = await Sandbox.connect(positionals[0] ?? "", connection(values));
    const { snapshot, sandboxes } = await parent.fork(count, {
      ...(values.name === undefined ? {} : { name: values.name }),
      ...(timeoutS === undefined ? {} : { timeoutS }),
      ...(values.memory === true ? { memory: true } : {}),
      ...(values["idempotency-key"] === undefined ? {} : { idempotencyKey: values["idempotency-key"] }),
    });
    if (values.json) printJson({ snapshot, sandboxes: sandboxes.map((s) => s.info) });
    else process.stdout.write([snapshot.snapshot_id, ...sandboxes.map((s) => s.sandboxId)].join("\n") + "\n");
    return 0;
  },
};
