import { Sandbox, type DriverName } from "@bothy/sdk";
import { CONNECTION_FLAGS, connection, intFlag, JSON_FLAG, parse, UsageError } from "../args/parse.ts";
import type { Command } from "../command.ts";
import { printJson } from "../output.ts";

const USAGE = `usage: bothy create [--template NAME] [--vcpu N] [--memory MIB] [--timeout S] [--driver gvisor|qemu] [--meta K=V]... [--no-internet] [--allow-out CIDR]... [--deny-out CIDR]... [--secret NAME]... [--volume NAME:PATH[:ro]]... [--snapshot REF] [--idempotency-key KEY] [--json]

Boots a sandbox and prints its id (with --json: the whole sandbox).

  --template NAME   template to boot (default seed)
  --vcpu N          virtual CPUs (default 1)
  --memory MIB      memory in MiB (default 512)
  --timeout S       delete it S seconds after it starts (default: the server's, 1 h)
  --driver D        gvisor or qemu (default: the server's)
  --meta K=V        a label returned with the sandbox (repeatable)
  --no-internet     no egress at all (except --allow-out destinations)
  --allow-out CIDR  open this destination (repeatable); a private one needs a network:private key and BOTHY_ALLOW_OUT_PERMIT
  --deny-out CIDR   block this destination too (repeatable)
  --secret NAME     a vault secret it may use: $NAME (upper-cased) holds its placeholder (repeatable)
  --volume NAME:PATH[:ro]  mount the volume NAME at PATH, read-only with :ro (repeatable; bothy volume)
  --snapshot REF    start from this snapshot (id or name; bothy snapshot), on its template
  --idempotency-key KEY   the same key again answers the same sandbox
`;

export const createCommand: Command = {
  name: "create",
  summary: "boot a sandbox and print its id",
  usage: USAGE,
  async run(args) {
    const { values } = parse(
      args,
      {
        ...CONNECTION_FLAGS,
        ...JSON_FLAG,
        template: { type: "string" },
        vcpu: { type: "string" },
        memory: { type: "string" },
        timeout: { type: "string" },
        driver: { type: "string" },
        "idempotency-key": { type: "string" },
        meta: { type: "string", multiple: true },
        "no-internet": { type: "boolean" },
        "allow-out": { type: "string", multiple: true },
        "deny-out": { type: "string", multiple: true },
        secret: { type: "string", multiple: true },
        volume: { type: "string", multiple: true },
        snapshot: { type: "string" },
      },
      { min: 0, max: 0, names: "" },
    );
    if (values.help) return help();
    if (values.driver !== undefined && values.driver !== "gvisor" && values.driver !== "qemu")
      throw new UsageError(`--driver is gvisor or qemu, got "${values.driver}"`);
    const vcpu = intFlag(values.vcpu, "vcpu");
    const memoryMib = intFlag(values.memory, "memory");
    const timeoutS = intFlag(values.timeout, "timeout");
    const metadata = labels(values.meta ?? []);
    const network = {
      ...(values["no-internet"] ? { internet: false } : {}),
      ...(values["allow-out"] ? { allowOut: values["allow-out"] } : {}),
      ...(values["deny-out"] ? { denyOut: values["deny-out"] } : {}),
    };
    const sandbox = await Sandbox.create({
      ...connection(values),
      ...(values.template === undefined ? {} : { template: values.template }),
      ...(vcpu === undefined ? {} : { vcpu }),
      ...(memoryMib === undefined ? {} : { memoryMib }),
      ...(timeoutS === undefined ? {} : { timeoutS }),
      ...(values.driver === undefined ? {} : { driver: values.driver as DriverName }),
      ...(values["idempotency-key"] === undefined ? {} : { idempotencyKey: values["idempotency-key"] }),
      ...(metadata === undefined ? {} : { metadata }),
      ...(Object.keys(network).length === 0 ? {} : { network }),
      ...(values.secret === undefined ? {} : { secrets: values.secret }),
      ...(values.volume === undefined ? {} : { volumes: values.volume.map(volumeArg) }),
      ...(values.snapshot === undefined ? {} : { snapshot: values.snapshot }),
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

/** `--meta k=v` pairs as an object; a pair without `=` is a usage error. */
function labels(pairs: string[]): Record<string, string> | undefined {
  if (pairs.length === 0) return undefined;
  const out: Record<string, string> = {};
  for (const pair of pairs) {
    const eq = pair.indexOf("=");
    if (eq <= 0) throw new UsageError(`--meta takes KEY=VALUE, got "${pair}"`);
    out[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  return out;
}

/** `--volume name:/path[:ro]` as a mount; anything else is a usage error. */
function volumeArg(arg: string): { name: string; path: string; readOnly?: boolean } {
  const m = /^([^:]+):(\/[^:]*)(?::(ro|rw))?$/.exec(arg);
  if (!m?.[1] || !m[2]) throw new UsageError(`--volume takes NAME:/PATH or NAME:/PATH:ro, got "${arg}"`);
  return { name: m[1], path: m[2], ...(m[3] === "ro" ? { readOnly: true } : {}) };
}
