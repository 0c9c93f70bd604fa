/**
 * Typed errors rebuilt from the server's problem `code`. Every error the SDK throws is a
 * `SandboxError`; the subclasses say what kind of failure it is, so callers can `instanceof`
 * without matching strings. A code this SDK does not know (a newer server) is classified by its
 * HTTP status instead.
 */
import type { ErrorCode } from "@bothy/protocol";

export interface SandboxErrorOptions {
  /** The server's stable error code (`sandbox_not_found`, …), or an SDK-side one (`connection_failed`). */
  code: string;
  /** The HTTP status, when the error came from an HTTP answer. */
  status?: number;
  cause?: unknown;
}

export class SandboxError extends Error {
  readonly code: string;
  readonly status: number | undefined;

  constructor(message: string, options: SandboxErrorOptions) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = options.code;
    this.status = options.status;
  }
}

/** The sandbox, command, file or template does not exist. */
export class NotFoundError extends SandboxError {}
/** The request was refused as malformed or out of range; fix the arguments. */
export class InvalidArgumentError extends SandboxError {}
/** The sandbox or file is in a state that does not allow this (not running, exists, changed). */
export class ConflictError extends SandboxError {}
/** A command or request ran out of time. */
export class TimeoutError extends SandboxError {}
/** The server is out of capacity or budget, or rate-limits this client; retry later. */
export class RateLimitError extends SandboxError {}
/** The API key is missing or not accepted. */
export class AuthenticationError extends SandboxError {}
/** This server or driver cannot do that (e.g. pause on gVisor). */
export class NotSupportedError extends SandboxError {}
/** The server could not be reached, or the connection broke mid-request. */
export class ConnectionError extends SandboxError {}

type ErrorClass = new (message: string, options: SandboxErrorOptions) => SandboxError;

const BY_CODE: Partial<Record<ErrorCode, ErrorClass>> = {
  invalid_json: InvalidArgumentError,
  invalid_request: InvalidArgumentError,
  unsupported_media_type: InvalidArgumentError,
  body_too_large: InvalidArgumentError,
  invalid_url: InvalidArgumentError,
  uri_too_long: InvalidArgumentError,
  headers_too_large: InvalidArgumentError,
  malformed_request: InvalidArgumentError,
  expectation_failed: InvalidArgumentError,
  request_timeout: TimeoutError,
  invalid_template_name: InvalidArgumentError,
  invalid_sandbox_id: InvalidArgumentError,
  idempotency_key_invalid: InvalidArgumentError,
  invalid_command: InvalidArgumentError,
  template_not_found: NotFoundError,
  sandbox_not_found: NotFoundError,
  command_not_found: NotFoundError,
  file_not_found: NotFoundError,
  route_not_found: NotFoundError,
  template_not_built: ConflictError,
  sandbox_not_running: ConflictError,
  sandbox_asleep: ConflictError,
  idempotency_key_reused: ConflictError,
  idempotency_key_in_flight: ConflictError,
  file_exists: ConflictError,
  precondition_failed: ConflictError,
  approval_not_found: NotFoundError,
  approval_not_pending: ConflictError,
  capacity_exhausted: RateLimitError,
  quota_exceeded: RateLimitError,
  unauthorized: AuthenticationError,
  scope_missing: AuthenticationError,
  csrf_token_invalid: AuthenticationError,
  not_supported: NotSupportedError,
  volume_not_found: NotFoundError,
  volume_exists: ConflictError,
  volume_in_use: ConflictError,
  volume_share_unsafe: ConflictError,
  invalid_volume_mount: InvalidArgumentError,
  snapshot_not_found: NotFoundError,
  snapshot_exists: ConflictError,
  snapshot_in_use: ConflictError,
  snapshot_memory_unsupported: NotSupportedError,
  node_unreachable: ConnectionError,
  node_not_found: NotFoundError,
};

const BY_STATUS: Record<number, ErrorClass> = {
  400: InvalidArgumentError,
  401: AuthenticationError,
  403: AuthenticationError,
  404: NotFoundError,
  408: TimeoutError,
  409: ConflictError,
  412: ConflictError,
  422: InvalidArgumentError,
  429: RateLimitError,
  501: NotSupportedError,
  504: TimeoutError,
};

/** Codes a newer server may send for rate, budget, auth and time limits. */
function byCodeName(code: string): ErrorClass | undefined {
  if (/rate|budget|quota|limit_exceeded/.test(code)) return RateLimitError;
  if (/auth|forbidden|api_key/.test(code)) return AuthenticationError;
  if (/timeout|timed_out|deadline/.test(code)) return TimeoutError;
  return undefined;
}

/** The typed error for a server error `code` (from a problem+json body or a WebSocket `error` frame). */
export function errorFromCode(code: string, message: string, status?: number): SandboxError {
  const cls =
    BY_CODE[code as ErrorCode] ??
    byCodeName(code) ??
    (status === undefined ? undefined : BY_STATUS[status]) ??
    SandboxError;
  return new cls(message, { code, ...(status === undefined ? {} : { status }) });
}

/** Rebuilds the typed error from an HTTP error answer (RFC 9457 problem+json, or anything else). */
export function errorFromProblem(status: number, body: string): SandboxError {
  let code = `http_${status}`;
  let message = body.trim().slice(0, 500) || `HTTP ${status}`;
  try {
    const problem = JSON.parse(body) as { code?: unknown; detail?: unknown; title?: unknown };
    if (typeof problem.code === "string") code = problem.code;
    if (typeof problem.detail === "string") message = problem.detail;
    else if (typeof problem.title === "string") message = problem.title;
  } catch {
    // Not JSON (a proxy's HTML page, say): the status and the body's start are all there is.
  }
  return errorFromCode(code, message, status);
}

/** What a finished command left: its exit code (null when a signal ended it) and its output. */
export interface CommandResult {
  commandId: string;
  exitCode: number | null;
  /** Set when a signal ended the command, e.g. "SIGKILL". */
  signal?: string;
  stdout: string;
  stderr: string;
}

/** A command ended with a non-zero exit code (or a signal); the result is kept on the error. */
export class CommandExitError extends SandboxError implements CommandResult {
  readonly commandId: string;
  readonly exitCode: number | null;
  readonly signal: string | undefined;
  readonly stdout: string;
  readonly stderr: string;

  constructor(result: CommandResult) {
    const how =
      result.exitCode === null ? `was ended by ${result.signal ?? "a signal"}` : `exited with code ${result.exitCode}`;
    const tail = result.stderr.trim().split("\n").slice(-3).join("\n");
    super(`Command ${result.commandId} ${how}${tail ? `: ${tail}` : ""}`, { code: "command_exit" });
    this.commandId = result.commandId;
    this.exitCode = result.exitCode;
    this.signal = result.signal;
    this.stdout = result.stdout;
    this.stderr = result.stderr;
  }
}

/** A command ran past its `timeoutS` and the server killed it; what it had done is kept as `result`. */
export class CommandTimeoutError extends TimeoutError {
  readonly result: CommandResult;

  constructor(result: CommandResult) {
    super(`Command ${result.commandId} ran past its timeout and was killed.`, { code: "command_timeout" });
    this.result = result;
  }
}
