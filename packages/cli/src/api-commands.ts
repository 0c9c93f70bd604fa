/**
 * The commands that work through bothy's public API (via @bothy/sdk), one file each under
 * commands/. main.ts gives each its commander command; usage errors print its usage with status 2.
 */
import { UsageError } from "./args/parse.ts";
import type { Command } from "./command.ts";
import { cpCommand } from "./commands/cp.ts";
import { createCommand } from "./commands/create.ts";
import { doctorCommand } from "./commands/doctor.ts";
import { execCommand } from "./commands/exec.ts";
import { infoCommand } from "./commands/info.ts";
import { keysCommand } from "./commands/keys.ts";
import { logsCommand } from "./commands/logs.ts";
import { lsCommand } from "./commands/ls.ts";
import { pauseCommand } from "./commands/pause.ts";
import { policyCommand } from "./commands/policy.ts";
import { portCommand } from "./commands/port.ts";
import { resumeCommand } from "./commands/resume.ts";
import { rmCommand } from "./commands/rm.ts";
import { shellCommand } from "./commands/shell.ts";
import { tenantsCommand } from "./commands/tenants.ts";
import { nodeCommand } from "./commands/node.ts";
import { secretsCommand } from "./commands/secrets.ts";
import { approvalsCommand } from "./commands/approvals.ts";
import { uiLinkCommand } from "./commands/ui-link.ts";
import { volumeCommand } from "./commands/volume.ts";
import { snapshotCommand } from "./commands/snapshot.ts";
import { forkCommand } from "./commands/fork.ts";

export const API_COMMANDS: Command[] = [
  createCommand,
  lsCommand,
  infoCommand,
  execCommand,
  shellCommand,
  cpCommand,
  portCommand,
  rmCommand,
  pauseCommand,
  resumeCommand,
  logsCommand,
  keysCommand,
  tenantsCommand,
  nodeCommand,
  secretsCommand,
  volumeCommand,
  snapshotCommand,
  forkCommand,
  approvalsCommand,
  policyCommand,
  uiLinkCommand,
  doctorCommand,
];

/** What `bothy --help` says of the API commands after listing them (main.ts). */
export const API_FOOTER = `API commands talk to BOTHY_URL (default http://127.0.0.1:8080; or --url) with BOTHY_API_KEY
(or --api-key; on the server's host, $BOTHY_HOME/admin.key when that is unset).`;

/** Runs an API command on the arguments after its name; a usage error prints its usage, status 2. */
export async function runApiCommand(command: Command, args: string[]): Promise<number> {
  try {
    return await command.run(args);
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`bothy ${command.name}: ${err.message}\n\n${command.usage}`);
      return 2;
    }
    throw err;
  }
}

/** `bothy: message (code)` for an error that ends a command. */
export function errorLine(err: unknown): string {
  const code = err instanceof Error && "code" in err && typeof err.code === "string" ? ` (${err.code})` : "";
  return `bothy: ${err instanceof Error ? err.message : String(err)}${code}\n`;
}
