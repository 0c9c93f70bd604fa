import type { FastifyError, FastifyReply } from "fastify";
import type { z } from "zod";
import { Code, ConnectError } from "@connectrpc/connect";
import { BothyError, toBothyError, type ErrorCode } from "@bothy/protocol";

/**
 * E2B's error body, `{"code": <HTTP status>, "message": "..."}`: the SDK reads the body's `code`
 * to choose its own error class (404 → SandboxNotFoundError, kill → false; 401, 429, 503, ...).
 */
export interface E2bErrorBody {
  code: number;
  message: string;
}

/** Statuses where E2B's contract differs from bothy's own for the same situation. */
const E2B_STATUS: Partial<Record<ErrorCode, number>> = {
  // E2B answers an id it does not know with 404, whatever its shape.
  invalid_sandbox_id: 404,
};

/** An error raised by the E2B surface with an HTTP status bothy's registry has no code for. */
export class E2bHttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    /** Fields E2B's answer carries beside `code` and `message` (its proxy's `sandboxId`, `canAutoResume`). */
    readonly extra: Record<string, string | boolean> = {},
  ) {
    super(message);
    this.name = new.target.name;
  }
}

export function toE2bError(err: unknown): { status: number; body: E2bErrorBody; bothy?: BothyError } {
  if (err instanceof E2bHttpError)
    return { status: err.status, body: { ...err.extra, code: err.status, message: err.message } };
  const fastifyErr = err as FastifyError;
  if (
    !(err instanceof BothyError) &&
    typeof fastifyErr?.statusCode === "number" &&
    fastifyErr.statusCode >= 400 &&
    fastifyErr.statusCode < 500
  ) {
    // Fastify's own refusals (body parsing, media type, size): its message names the problem.
    return { status: fastifyErr.statusCode, body: { code: fastifyErr.statusCode, message: fastifyErr.message } };
  }
  const bothy = toBothyError(err);
  const status = E2B_STATUS[bothy.code] ?? bothy.status;
  return { status, body: { code: status, message: bothy.message }, bothy };
}

export function sendE2bError(reply: FastifyReply, err: unknown, log: (err: BothyError) => void): FastifyReply {
  const { status, body, bothy } = toE2bError(err);
  if (bothy) log(bothy);
  return reply.code(status).type("application/json").send(body);
}

/** A bothy error as a Connect error, with the code envd would use so the SDK raises the same class. */
export function toConnectError(err: unknown): ConnectError {
  if (err instanceof ConnectError) return err;
  const bothy = toBothyError(err);
  return new ConnectError(bothy.message, connectCode(bothy.code));
}

function connectCode(code: ErrorCode): Code {
  switch (code) {
    case "file_not_found":
    case "command_not_found":
    case "sandbox_not_found":
      return Code.NotFound;
    case "file_exists":
      return Code.AlreadyExists;
    case "invalid_request":
    case "invalid_command":
    case "file_error":
      return Code.InvalidArgument;
    case "capacity_exhausted":
      return Code.ResourceExhausted;
    case "sandbox_asleep":
      return Code.FailedPrecondition;
    case "sandbox_not_running":
    case "agent_unavailable":
    case "shutting_down":
      return Code.Unavailable;
    case "not_supported":
      return Code.Unimplemented;
    case "precondition_failed":
      return Code.FailedPrecondition;
    default:
      return Code.Internal;
  }
}

/** Parses a request part, or refuses it with 400 naming the first problem. */
export function parseE2b<T extends z.ZodType>(schema: T, value: unknown, what: string): z.infer<T> {
  const parsed = schema.safeParse(value ?? {});
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0];
  const where = issue?.path.length ? `${issue.path.join(".")}: ` : "";
  throw new E2bHttpError(400, `${what}: ${where}${issue?.message ?? "invalid"}`);
}
