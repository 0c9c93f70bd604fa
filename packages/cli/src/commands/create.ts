import { Sandbox, type DriverName } from "@bothy/sdk";
import { CONNECTION_FLAGS, connection, intFlag, JSON_FLAG, parse, UsageError } from "../args/parse.ts";
import type { Command } from "../command.ts";
import { printJson } from "../output.ts";

const USAGE = `usage: bothy create [--template NAME] [--vcpu N] [--memory MIB] [--timeout S] [--driver gvisor|qemu] [--idempotency-key KEY] [--json]

Boots a sandbox and prints its id (with --json: the whole sandbox).

  --template NAME   template to boot (default seed)
  --vcpu N          virtual CPUs (default 1)
  --memory MIB      memory in MiB (default 512)
  --timeout S       delete it S seconds after it starts (default: the server's, 1 h)
  --driver D        gvisor or qemu (default: the server's)
  --idempotency-key KEY   the same key again answers the same sandbox
`;

export const createCommand: Command = {
  name: "create",
  summary: "boot a sandbox and print its id",
  usage: USAGE,
  async run(args) {
    const { values } = parse(
      args,
      { ...CONNECTION_FLAGS, ...JSON_FLAG, template: { type: "string" }, vcpu: { type: "string" }, memory: { type: "string" }, timeout: { type: "string" }, driver: { type: "string" }, "idempotency-key": { type: "string" } },
      { min: 0, max: 0, names: "" },
    );
    if (values.help) return help();
    if (values.driver !== undefined && values.driver !== "gvisor" && values.driver !== "qemu") throw new UsageError(`--driver is gvisor or qemu, got "${values.driver}"`);
    const vcpu = intFlag(values.vcpu, "vcpu");
    const memoryMib = intFlag(values.memory, "memory");
    const timeoutS = intFlag(values.timeout, "timeout");
    const sandbox = await Sandbox.create({
      ...connection(values),
      ...(values.template === undefined ? {} : { template: values.template }),
      ...(vcpu === undefined ? {} : { vcpu }),
      ...(memoryMib === undefined ? {} : { memoryMib }),
      ...(timeoutS === undefined ? {} : { timeoutS }),
      ...(values.driver === undefined ? {} : { driver: values.driver as DriverName }),
      ...(values["idempotency-key"] === undefined ? {} : { idempotencyKey: values["idempotency-key"] }),
    });
    if (values.json) printJson(sandbox.info);
    else process.stdout.write(`${sandbox.sandboxId}\n`);
    return 0;
  },
};

function help(): number {
  process.stdout.write(USAGE);
  return 0;
}
