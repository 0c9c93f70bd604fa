import { BothyError } from "@bothy/protocol";

/**
 * An error raised inside the server (drivers, network, images, boot). Its message says, in the
 * server's own words and without any text from below, what failed; whatever caused it stays in
 * `cause`. It carries no HTTP status: the API boundary decides that once (`toCreateFailure`,
 * `toWakeFailure`, `toResumeFailure`; driver-registry.ts for preflights), and the cause chain
 * goes to the log, never to a client. A failed host command is a `HostCommandError`
 * (util/host-command.ts), not one of these: its message quotes stderr.
 */
export class InternalError extends Error {
  /** What the failing part printed (QEMU's last words, the guest console's last lines): for the log, like the cause. */
  readonly diagnostics: string | undefined;

  constructor(message: string, options?: { cause?: unknown; diagnostics?: string }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.diagnostics = options?.diagnostics || undefined;
  }
}

/** The part of a boot that failed. */
export type BootStep =
  "prepare" | "start" | "attach" | "restore" | "handshake" | "identify" | "network" | "limits" | "volumes" | "trust";

/** A sandbox could not start; `step` names the part of the boot that failed. */
export class BootError extends InternalError {
  readonly step: BootStep;

  constructor(step: BootStep, message: string, options?: { cause?: unknown; diagnostics?: string }) {
    super(message, options);
    this.step = step;
  }
}

/** A sandbox's network (namespace, veth, nftables rules) could not be set up. */
export class NetworkSetupError extends InternalError {}

/** What a VM boots from (guest kernel, initramfs, ext4 image, warm-start snapshot) could not be made. */
export class TemplateError extends InternalError {}

/**
 * The host lacks what a driver or the network needs (a program, the agent bundle, a usable
 * path or interface); the message says what to install or set. A preflight's failure makes its
 * driver unavailable (driver-registry.ts answers for it); at a boot it becomes `create_failed`.
 */
export class HostSetupError extends InternalError {}

/**
 * This host cannot give what was asked (cgroup controllers to limit sandboxes) and the operator did
 * not opt out; the message says how to fix the host. Public: `501 not_supported`, at any boundary.
 */
export class NotSupportedError extends InternalError {}

function refusalAnswer(err: NotSupportedError): BothyError {
  return new BothyError("not_supported", err.message, { cause: err });
}

const BOOT_FAILED = "The sandbox failed to boot; the server log has the details.";

/**
 * The answer for a create that failed: a BothyError passes as it is (it was meant for the
 * client), an internal error becomes `create_failed` with its own message, anything else
 * `create_failed` with a generic one. The original error is the answer's cause, for the log.
 */
export function toCreateFailure(err: unknown): BothyError {
  if (err instanceof BothyError) return err;
  if (err instanceof NotSupportedError) return refusalAnswer(err);
  return new BothyError("create_failed", err instanceof InternalError ? err.message : BOOT_FAILED, { cause: err });
}

/** The answer for a dormant sandbox that could not be started again: it stays stopped, its files kept. */
export function toWakeFailure(sandboxId: string, err: unknown): BothyError {
  const why =
    err instanceof BothyError || err instanceof InternalError ? err.message : "the server log has the details.";
  return new BothyError(
    "sandbox_not_running",
    `Sandbox ${sandboxId} could not be started again; its files are kept: ${why}`,
    {
      cause: err,
    },
  );
}

/** The answer for a paused sandbox that could not be resumed (it stays paused, or is gone if it cannot come back). */
export function toResumeFailure(err: unknown): BothyError {
  if (err instanceof BothyError) return err;
  if (err instanceof NotSupportedError) return refusalAnswer(err);
  return new BothyError(
    "agent_unavailable",
    err instanceof InternalError ? err.message : "The sandbox could not be resumed; the server log has the details.",
    { cause: err },
  );
}

/**
 * One line for a log field: each error of the chain with its name, outermost first, and the
 * diagnostics where an internal error has them.
 */
export function describeCauses(err: unknown): string {
  const parts: string[] = [];
  const seen = new Set<unknown>();
  for (let e: unknown = err; e !== undefined && e !== null && !seen.has(e);) {
    seen.add(e);
    if (!(e instanceof Error)) {
      parts.push(String(e));
      break;
    }
    const diag = e instanceof InternalError && e.diagnostics ? ` [${e.diagnostics}]` : "";
    parts.push(`${e.name}: ${e.message}${diag}`);
    e = e.cause;
  }
  return parts.join(" <- ");
}
