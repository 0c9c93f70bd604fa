import { STATUS_CODES, type IncomingMessage, type ServerResponse } from "node:http";
import type { Socket } from "node:net";
import type { FastifyError, FastifyReply, FastifyRequest } from "fastify";
import { BothyError, toBothyError, toProblem, type ErrorCode } from "@bothy/protocol";
import { InternalError, toCreateFailure } from "../errors/internal-errors.ts";

/**
 * What a client may still send once it is refused is read and dropped, up to this much, so a
 * client that sends all before it reads (Node's fetch) can finish and read the answer; past it the
 * connection is closed. Twice the largest body limit of any route (the corpus's 64 MiB).
 */
const DISCARD_LIMIT = 128 * 1024 * 1024;
/** How long a connection refused by the HTTP parser may stay quiet before it is closed. */
const LINGER_MS = 5_000;

const NOT_JSON = 'The body is not valid JSON; send a JSON object such as {"template":"seed"}.';

/** Fastify's own errors (URL, body parsing, limits) mapped to bothy's stable codes. */
function fromFastify(err: FastifyError, request: FastifyRequest): BothyError | undefined {
  switch (err.code) {
    case "FST_ERR_CTP_BODY_TOO_LARGE": {
      const mib = Math.round((request.routeOptions.bodyLimit / 1024 / 1024) * 10) / 10;
      return new BothyError(
        "body_too_large",
        `The request body is over ${mib} MiB, the most this route takes; sandbox requests are small JSON objects, and files of any size go through PUT /sandboxes/{id}/files.`,
      );
    }
    case "FST_ERR_CTP_INVALID_MEDIA_TYPE":
      return new BothyError("unsupported_media_type", "Send the body as JSON with Content-Type: application/json.");
    case "FST_ERR_CTP_EMPTY_JSON_BODY":
      return new BothyError(
        "invalid_json",
        "The body is empty but Content-Type says JSON; send a JSON object or no Content-Type.",
      );
    case "FST_ERR_CTP_INVALID_JSON_BODY":
      return new BothyError("invalid_json", NOT_JSON);
    case "FST_ERR_CTP_INVALID_CONTENT_LENGTH":
      return new BothyError("invalid_request", "Content-Length does not match the body.");
    case "FST_ERR_BAD_URL":
      return new BothyError(
        "invalid_url",
        "The URL's path is not valid: every %-escape must be two hex digits and together they must encode UTF-8; percent-encode path segments with encodeURIComponent.",
      );
    case "FST_ERR_MAX_PARAM_LENGTH":
      return new BothyError(
        "uri_too_long",
        "A path segment is over 100 characters, longer than any id or name of this API; check the URL (ids come from the answers that made them).",
      );
  }
  if (err instanceof SyntaxError && err.statusCode === 400) return new BothyError("invalid_json", NOT_JSON);
  return undefined;
}

/** The code for a client error (4xx) some part of the HTTP stack raised that has no mapping of its own. */
const BY_STATUS: Record<number, ErrorCode> = {
  404: "route_not_found",
  405: "method_not_allowed",
  408: "request_timeout",
  413: "body_too_large",
  414: "uri_too_long",
  415: "unsupported_media_type",
  431: "headers_too_large",
};

/** The BothyError an answer carries for any thrown value; bad input is never a 5xx. */
function toAnswer(err: unknown, request: FastifyRequest): BothyError {
  if (err instanceof BothyError) return err;
  // Internal errors are all about making or starting a sandbox; the manager maps those it catches.
  if (err instanceof InternalError) return toCreateFailure(err);
  const mapped = fromFastify(err as FastifyError, request);
  if (mapped) return mapped;
  const status = (err as { statusCode?: unknown } | undefined)?.statusCode;
  if (typeof status === "number" && status >= 400 && status < 500) {
    const reason = err instanceof Error ? err.message.replace(/\.$/, "") : (STATUS_CODES[status] ?? "refused");
    return new BothyError(
      BY_STATUS[status] ?? "invalid_request",
      `The request was refused: ${reason}. See /openapi.json for the API.`,
    );
  }
  return toBothyError(err);
}

/**
 * Keeps reading the body of a request answered before it was read. Fastify asks for
 * `Connection: close` then, and closing a socket with unread input resets it, which a client
 * still sending sees as EPIPE instead of the answer.
 */
function discardRest(raw: IncomingMessage, reply: FastifyReply): void {
  if (raw.complete || raw.destroyed) return;
  reply.removeHeader("connection");
  let left = DISCARD_LIMIT;
  raw.on("data", (chunk: Buffer) => {
    left -= chunk.length;
    if (left < 0) raw.socket.destroy();
  });
  raw.resume();
}

export function sendProblem(
  reply: FastifyReply,
  request: FastifyRequest,
  err: unknown,
  log: (err: BothyError) => void,
): FastifyReply {
  const bothyError = toAnswer(err, request);
  log(bothyError);
  discardRest(request.raw, reply);
  return reply
    .code(bothyError.status)
    .type("application/problem+json")
    .send(toProblem(bothyError, request.url.split("?")[0]));
}

/**
 * Answers an `Expect` other than 100-continue (Node's `checkExpectation`), which Node would
 * otherwise answer with a bare 417 of its own.
 */
export function answerExpectation(req: IncomingMessage, res: ServerResponse, log: (err: BothyError) => void): void {
  const bothyError = new BothyError(
    "expectation_failed",
    `This server meets no expectation but 100-continue; send the request without "Expect: ${String(req.headers.expect).slice(0, 64)}".`,
  );
  log(bothyError);
  const body = JSON.stringify(toProblem(bothyError, req.url?.split("?")[0]));
  res
    .writeHead(bothyError.status, {
      "content-type": "application/problem+json",
      "content-length": Buffer.byteLength(body),
    })
    .end(body);
}

/** Why Node's HTTP parser refused a request (Node's `clientError`), as a BothyError. */
function fromParser(err: NodeJS.ErrnoException): BothyError {
  if (err.code === "HPE_HEADER_OVERFLOW")
    return new BothyError(
      "headers_too_large",
      "The request line and headers are over 16 KiB together; send large data in the body, not in the URL or headers.",
    );
  if (err.code === "ERR_HTTP_REQUEST_TIMEOUT")
    return new BothyError("request_timeout", "The request did not arrive in time; send the whole request at once.");
  const reason = err.message.replace(/^Parse Error: /, "").replace(/\.$/, "");
  return new BothyError(
    "malformed_request",
    `The request is not well-formed HTTP/1.1 (${reason}); send it with an HTTP client, or fix the proxy in between.`,
  );
}

/**
 * Answers a request Node's HTTP parser refused (before Fastify sees it) with problem+json, then
 * ends the connection while still reading, so the client gets the answer rather than a reset.
 */
export function answerClientError(err: NodeJS.ErrnoException, socket: Socket, log: (err: BothyError) => void): void {
  if (err.code === "ECONNRESET" || socket.destroyed) return;
  // The parser reports every later chunk of a refused connection again; the first answer stands.
  if (socket.writableEnded) return;
  // A response already under way (Node's own handler checks the same) cannot be followed by another.
  const current = (socket as Socket & { _httpMessage?: { headersSent?: boolean } })._httpMessage;
  if (!socket.writable || current?.headersSent) {
    socket.destroy();
    return;
  }
  const bothyError = fromParser(err);
  log(bothyError);
  const body = JSON.stringify(toProblem(bothyError));
  socket.end(
    `HTTP/1.1 ${bothyError.status} ${STATUS_CODES[bothyError.status] ?? ""}\r\n` +
      "Content-Type: application/problem+json\r\n" +
      `Content-Length: ${Buffer.byteLength(body)}\r\n` +
      "Connection: close\r\n\r\n" +
      body,
  );
  // Reading on lets what the client still sends arrive instead of resetting the connection;
  // the client closes once it has read the answer, and a client that never does is cut off.
  let left = DISCARD_LIMIT;
  socket.on("data", (chunk: Buffer) => {
    left -= chunk.length;
    if (left < 0) socket.destroy();
  });
  socket.setTimeout(LINGER_MS, () => socket.destroy());
  socket.resume();
}
