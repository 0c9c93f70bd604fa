/**
 * What the tools add to the SDK (`@bothy/sdk`, their one client of the sandbox API): a command
 * run to its end whatever the end, and SDK errors back as the server's own errors.
 */
import { BothyError, isErrorCode } from "@bothy/protocol";
import { CommandTimeoutError, SandboxError, type CommandResult, type RunOptions, type Sandbox } from "@bothy/sdk";

export interface CommandEnd extends CommandResult {
  timedOut: boolean;
}

/** Runs a command to its end: a non-zero exit or a timeout is a result here, not an error. */
export async function runToEnd(sandbox: Sandbox, cmd: string, options: RunOptions): Promise<CommandEnd> {
  try {
    return { ...(await sandbox.commands.run(cmd, { ...options, throwOnError: false })), timedOut: false };
  } catch (err) {
    if (err instanceof CommandTimeoutError) return { ...err.result, timedOut: true };
    throw err;
  }
}

/**
 * An SDK error as the BothyError the server answered (same code), for this server's own routes;
 * anything else as it is.
 */
export function asBothyError(err: unknown): unknown {
  if (err instanceof SandboxError && isErrorCode(err.code))
    return new BothyError(err.code, err.message, { cause: err });
  return err;
}
