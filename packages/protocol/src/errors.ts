/**
 * The error-code registry. Every error that leaves a bothy component carries one of these codes;
 * the status map is exhaustive, so a new code without an HTTP status fails the type check.
 */
export const ERROR_CODES = [
  "invalid_json",
  "invalid_request",
  "unsupported_media_type",
  "body_too_large",
  "invalid_url",
  "uri_too_long",
  "headers_too_large",
  "malformed_request",
  "request_timeout",
  "expectation_failed",
  "invalid_template_name",
  "template_not_found",
  "template_not_built",
  "invalid_template",
  "template_build_failed",
  "invalid_sandbox_id",
  "sandbox_not_found",
  "sandbox_not_running",
  "sandbox_asleep",
  "idempotency_key_invalid",
  "idempotency_key_reused",
  "idempotency_key_in_flight",
  "invalid_command",
  "command_not_found",
  "route_not_found",
  "method_not_allowed",
  "upgrade_required",
  "capacity_exhausted",
  "create_failed",
  "agent_unavailable",
  "agent_protocol_error",
  "agent_timeout",
  "file_not_found",
  "file_error",
  "file_exists",
  "precondition_failed",
  "port_not_listening",
  "desktop_not_available",
  "desktop_failed",
  "conversation_not_found",
  "turn_not_found",
  "turn_ended",
  "export_not_found",
  "document_not_found",
  "not_supported",
  "unauthorized",
  "scope_missing",
  "host_not_allowed",
  "origin_refused",
  "csrf_token_invalid",
  "ui_not_built",
  "quota_exceeded",
  "key_not_found",
  "tenant_not_found",
  "tenant_exists",
  "tenant_in_use",
  "secret_not_found",
  "secret_unknown",
  "secret_refused",
  "upstream_failed",
  "approval_not_found",
  "approval_not_pending",
  "shutting_down",
  "lease_lost",
  "forward_refused",
  "node_unreachable",
  "node_not_found",
  "internal",
  "egress_denied",
  "egress_unreachable",
  "allow_out_not_permitted",
  "volume_not_found",
  "volume_exists",
  "volume_in_use",
  "invalid_volume_mount",
  "snapshot_not_found",
  "snapshot_exists",
  "snapshot_in_use",
  "snapshot_memory_unsupported",
  "volume_share_unsafe",
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];

export const ERROR_STATUS: Record<ErrorCode, number> = {
  invalid_json: 400,
  invalid_request: 400,
  unsupported_media_type: 415,
  body_too_large: 413,
  invalid_url: 400,
  uri_too_long: 414,
  headers_too_large: 431,
  malformed_request: 400,
  request_timeout: 408,
  expectation_failed: 417,
  invalid_template_name: 400,
  template_not_found: 404,
  template_not_built: 409,
  invalid_template: 500,
  template_build_failed: 500,
  invalid_sandbox_id: 400,
  sandbox_not_found: 404,
  sandbox_not_running: 409,
  sandbox_asleep: 409,
  idempotency_key_invalid: 400,
  idempotency_key_reused: 422,
  idempotency_key_in_flight: 409,
  invalid_command: 400,
  command_not_found: 404,
  route_not_found: 404,
  method_not_allowed: 405,
  upgrade_required: 426,
  capacity_exhausted: 503,
  create_failed: 500,
  agent_unavailable: 502,
  agent_protocol_error: 502,
  agent_timeout: 504,
  file_not_found: 404,
  file_error: 400,
  file_exists: 409,
  precondition_failed: 412,
  port_not_listening: 502,
  desktop_not_available: 409,
  desktop_failed: 502,
  conversation_not_found: 404,
  turn_not_found: 404,
  turn_ended: 409,
  export_not_found: 404,
  document_not_found: 404,
  not_supported: 501,
  unauthorized: 401,
  scope_missing: 403,
  host_not_allowed: 403,
  origin_refused: 403,
  csrf_token_invalid: 403,
  ui_not_built: 404,
  quota_exceeded: 429,
  key_not_found: 404,
  tenant_not_found: 404,
  tenant_exists: 409,
  tenant_in_use: 409,
  secret_not_found: 404,
  secret_unknown: 400,
  secret_refused: 403,
  upstream_failed: 502,
  approval_not_found: 404,
  approval_not_pending: 409,
  shutting_down: 503,
  lease_lost: 503,
  forward_refused: 403,
  node_unreachable: 502,
  node_not_found: 404,
  internal: 500,
  egress_denied: 403,
  egress_unreachable: 502,
  allow_out_not_permitted: 403,
  volume_not_found: 404,
  volume_exists: 409,
  volume_in_use: 409,
  invalid_volume_mount: 400,
  snapshot_not_found: 404,
  snapshot_exists: 409,
  snapshot_in_use: 409,
  snapshot_memory_unsupported: 501,
  volume_share_unsafe: 409,
};

const TITLES: Record<ErrorCode, string> = {
  invalid_json: "Malformed JSON",
  invalid_request: "Invalid request",
  unsupported_media_type: "Unsupported media type",
  body_too_large: "Request body too large",
  invalid_url: "Invalid URL",
  uri_too_long: "URI too long",
  headers_too_large: "Request header fields too large",
  malformed_request: "Malformed HTTP request",
  request_timeout: "Request timeout",
  expectation_failed: "Expectation failed",
  invalid_template_name: "Invalid template name",
  template_not_found: "Template not found",
  template_not_built: "Template not built",
  invalid_template: "Invalid template definition",
  template_build_failed: "Template build failed",
  invalid_sandbox_id: "Invalid sandbox id",
  sandbox_not_found: "Sandbox not found",
  sandbox_not_running: "Sandbox not running",
  sandbox_asleep: "Sandbox asleep",
  idempotency_key_invalid: "Invalid Idempotency-Key",
  idempotency_key_reused: "Idempotency-Key reused with another request",
  idempotency_key_in_flight: "Request with this Idempotency-Key in progress",
  invalid_command: "Invalid command message",
  command_not_found: "Command not found",
  route_not_found: "Not found",
  method_not_allowed: "Method not allowed",
  upgrade_required: "WebSocket upgrade required",
  capacity_exhausted: "No capacity",
  create_failed: "Sandbox creation failed",
  agent_unavailable: "Guest agent unavailable",
  agent_protocol_error: "Guest agent protocol error",
  agent_timeout: "Guest agent did not answer in time",
  file_not_found: "File not found",
  file_error: "File operation failed",
  file_exists: "File exists",
  precondition_failed: "Precondition failed",
  port_not_listening: "Nothing listens on that port",
  desktop_not_available: "No desktop in this sandbox",
  desktop_failed: "The desktop failed",
  conversation_not_found: "Conversation not found",
  turn_not_found: "Turn not found",
  turn_ended: "Turn ended",
  export_not_found: "Export not found",
  document_not_found: "Document not found",
  not_supported: "Not supported",
  unauthorized: "API key missing or not valid",
  scope_missing: "API key lacks a scope",
  host_not_allowed: "Host not allowed",
  origin_refused: "Cross-origin request refused",
  csrf_token_invalid: "CSRF token missing or wrong",
  ui_not_built: "Dashboard not built",
  quota_exceeded: "Tenant quota exceeded",
  key_not_found: "API key not found",
  tenant_not_found: "Tenant not found",
  tenant_exists: "Tenant exists",
  tenant_in_use: "Tenant still has sandboxes, keys or data",
  secret_not_found: "Secret not found",
  secret_unknown: "Secret not in the vault",
  secret_refused: "Secret sent to a host it is not bound to",
  upstream_failed: "Upstream host failed",
  approval_not_found: "Approval not found",
  approval_not_pending: "Approval already decided",
  shutting_down: "Server shutting down",
  lease_lost: "Lease lost",
  forward_refused: "Forwarded request refused",
  node_unreachable: "Node unreachable",
  node_not_found: "Node not found",
  internal: "Internal error",
  egress_denied: "Egress denied by policy",
  egress_unreachable: "Egress destination unreachable",
  allow_out_not_permitted: "allow_out names an address this server does not open",
  volume_not_found: "Volume not found",
  volume_exists: "Volume already exists",
  volume_in_use: "Volume in use",
  invalid_volume_mount: "Invalid volume mount",
  snapshot_not_found: "Snapshot not found",
  snapshot_exists: "Snapshot already exists",
  snapshot_in_use: "Snapshot in use",
  snapshot_memory_unsupported: "Memory snapshots not supported by this driver",
  volume_share_unsafe: "Volume cannot be shared this way",
};

export function errorTitle(code: ErrorCode): string {
  return TITLES[code];
}

export function isErrorCode(value: unknown): value is ErrorCode {
  return typeof value === "string" && (ERROR_CODES as readonly string[]).includes(value);
}

/** The one error type of bothy: a stable code, a message that says what to do, an optional cause. */
export class BothyError extends Error {
  readonly code: ErrorCode;
  readonly details: Record<string, unknown> | undefined;

  constructor(code: ErrorCode, message: string, options?: { cause?: unknown; details?: Record<string, unknown> }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.details = options?.details;
  }

  get status(): number {
    return ERROR_STATUS[this.code];
  }
}

/** Converts any thrown value into a BothyError; unknown errors become `internal` without leaking their text. */
export function toBothyError(err: unknown): BothyError {
  if (err instanceof BothyError) return err;
  return new BothyError("internal", "An internal error occurred; the server log has the details.", { cause: err });
}

/** RFC 9457 problem details, with bothy's stable `code`. */
export interface Problem {
  type: string;
  title: string;
  status: number;
  code: ErrorCode;
  detail: string;
  instance?: string;
  [extra: string]: unknown;
}

export function toProblem(err: BothyError, instance?: string): Problem {
  return {
    type: `https://bothy.dev/errors/${err.code}`,
    title: errorTitle(err.code),
    status: err.status,
    code: err.code,
    detail: err.message,
    ...(instance === undefined ? {} : { instance }),
    ...(err.details ?? {}),
  };
}
