import type { FastifyError, FastifyReply, FastifyRequest } from "fastify";
import { BothyError, toBothyError, toProblem } from "@bothy/protocol";

/** Fastify's own errors (body parsing, limits) mapped to bothy's stable codes. */
function fromFastify(err: FastifyError): BothyError | undefined {
  switch (err.code) {
    case "FST_ERR_CTP_BODY_TOO_LARGE":
      return new BothyError(
        "body_too_large",
        "The request body is too large; sandbox requests are small JSON objects (at most 1 MiB).",
      );
    case "FST_ERR_CTP_INVALID_MEDIA_TYPE":
      return new BothyError("unsupported_media_type", "Send the body as JSON with Content-Type: application/json.");
    case "FST_ERR_CTP_EMPTY_JSON_BODY":
      return new BothyError(
        "invalid_json",
        "The body is empty but Content-Type says JSON; send a JSON object or no Content-Type.",
      );
    case "FST_ERR_CTP_INVALID_JSON_BODY":
      return new BothyError(
        "invalid_json",
        'The body is not valid JSON; send a JSON object such as {"template":"seed"}.',
      );
    case "FST_ERR_CTP_INVALID_CONTENT_LENGTH":
      return new BothyError("invalid_request", "Content-Length does not match the body.");
  }
  if (err instanceof SyntaxError && err.statusCode === 400) {
    return new BothyError(
      "invalid_json",
      'The body is not valid JSON; send a JSON object such as {"template":"seed"}.',
    );
  }
  return undefined;
}

export function sendProblem(
  reply: FastifyReply,
  request: FastifyRequest,
  err: unknown,
  log: (err: BothyError) => void,
): FastifyReply {
  const bothyError = (err instanceof BothyError ? err : fromFastify(err as FastifyError)) ?? toBothyError(err);
  log(bothyError);
  return reply
    .code(bothyError.status)
    .type("application/problem+json")
    .send(toProblem(bothyError, request.url.split("?")[0]));
}
