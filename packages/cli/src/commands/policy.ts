import { readFile } from "node:fs/promises";
import { TenantPolicy, type HostPolicyRequest } from "@bothy/sdk";
import { connection, UsageError } from "../args/parse.ts";
import { subcommandsCommand } from "../command.ts";
import { printJson } from "../output.ts";

const USAGE = `usage: bothy policy show [--tenant ID]
       bothy policy set FILE|- [--tenant ID]
       bothy policy clear [--tenant ID]

The tenant's default host policy: its rules come before every one of its sandboxes' own.
FILE is JSON, e.g. {"allow_hosts":["api.github.com","*.npmjs.org"],
"rules":[{"host":"api.github.com","methods":["POST"],"action":"ask"}],"tools":{"send_file":"ask"}}.
Setting or clearing it takes scope policy; --tenant names another tenant (admin keys only).
`;

async function readPolicy(source: string): Promise<HostPolicyRequest> {
  let text: string;
  if (source === "-") {
    const chunks: Buffer[] = [];
    for await (const c of process.stdin) chunks.push(c as Buffer);
    text = Buffer.concat(chunks).toString("utf8");
  } else text = await readFile(source, "utf8");
  try {
    return JSON.parse(text) as HostPolicyRequest;
  } catch (err) {
    throw new UsageError(`${source === "-" ? "stdin" : source} is not JSON: ${(err as Error).message}`);
  }
}

export const policyCommand = subcommandsCommand({
  name: "policy",
  summary: "show or set the tenant's default host policy",
  usage: USAGE,
  options: { tenant: { type: "string" } },
  positionals: { min: 0, max: 1, names: "policy file" },
  async run(sub, { values, positionals }) {
    const options = { ...connection(values), ...(values.tenant === undefined ? {} : { tenant: values.tenant }) };
    if (sub === "show") printJson(await TenantPolicy.get(options));
    else if (sub === "set") {
      const [file] = positionals;
      if (file === undefined) throw new UsageError("missing policy file (or - for stdin)");
      printJson(await TenantPolicy.set(await readPolicy(file), options));
    } else if (sub === "clear") printJson(await TenantPolicy.clear(options));
    else throw new UsageError(`unknown subcommand ${sub}`);
    return 0;
  },
});
