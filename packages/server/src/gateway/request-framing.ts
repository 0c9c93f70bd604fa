/**
 * How the gateway frames a sandbox's request body on its way upstream, so the upstream reads
 * exactly the request the gateway judged and nothing after it (no request smuggling).
 *
 * The sandbox's side was parsed by Node (llhttp for HTTP/1.1, which already refuses both length
 * headers together, duplicate or malformed Content-Length and a Transfer-Encoding that does not end
 * in chunked; nghttp2 for HTTP/2, which holds DATA to a stated content-length). The upstream's side
 * is written by Node's client, which sends a body written to a GET unframed: so the gateway sets
 * the framing itself, from what it parsed, and never passes the client's length headers on as such.
 *
 * - No body: nothing may follow the headers; a byte that arrives anyway (HTTP/2 DATA on a GET whose
 *   HEADERS did not end the stream) stops the request before anything else is written.
 * - A known length (Content-Length): sent as that length, and the bytes are counted.
 * - An unknown length (chunked HTTP/1.1, HTTP/2 DATA without content-length): re-chunked by the
 *   gateway (Transfer-Encoding: chunked of its own).
 *
 * Refused outright (400 `malformed_request`, nothing sent): a body on GET, HEAD or TRACE (servers
 * that ignore such a body read it as the next request), a Transfer-Encoding other than plain
 * `chunked` (the gateway cannot say what the decoded bytes are), a target that is not a path
 * (an absolute URL names a host the upstream may prefer to the one judged), and CONNECT.
 *
 * An upstream connection is reused only after an ordinary request: no body, or a counted body on
 * POST, PUT or PATCH. Any other body goes on a connection of its own that closes after it, so an
 * upstream that misreads it has nothing of a later request to misread.
 */
import { STATUS_CODES, type IncomingMessage } from "node:http";
import type { Http2ServerRequest } from "node:http2";
import { Transform, type TransformCallback } from "node:stream";
import { BothyError, toProblem } from "@bothy/protocol";

export type Framing = { kind: "none" } | { kind: "length"; length: number } | { kind: "chunked" };

export type FramingVerdict = { ok: true; framing: Framing; pooled: boolean } | { ok: false; error: BothyError };

/** Methods whose body has no meaning: one with a body is refused. */
const BODYLESS = new Set(["GET", "HEAD", "TRACE"]);
/** Methods whose counted body servers read as a body: the connection may serve the next request. */
const POOLED_WITH_BODY = new Set(["POST", "PUT", "PATCH"]);

/** The framing a request's body gets upstream, or why it is refused. */
export function requestFraming(req: IncomingMessage | Http2ServerRequest): FramingVerdict {
  const method = (req.method ?? "GET").toUpperCase();
  const target = req.url ?? "";
  if (method === "CONNECT")
    return refuse(
      "method_not_allowed",
      "CONNECT is not forwarded by the gateway: a sandbox's TCP 80 and 443 already go to the host they name.",
    );
  if (!target.startsWith("/") && !(method === "OPTIONS" && target === "*"))
    return refuse(
      "malformed_request",
      "The request target must be a path (origin form, starting with /): the gateway judges the host in Host or the TLS server name, and does not forward absolute URLs.",
    );
  const framing = framingOf(req);
  if (!framing.ok) return framing;
  const f = framing.framing;
  if (BODYLESS.has(method) && f.kind !== "none")
    return refuse(
      "malformed_request",
      `A ${method} request through the gateway may not carry a body (upstreams may read it as a second request); send the body with POST.`,
    );
  const pooled = f.kind === "none" || (f.kind === "length" && POOLED_WITH_BODY.has(method));
  return { ok: true, framing: f, pooled };
}

function framingOf(req: IncomingMessage | Http2ServerRequest): FramingVerdict {
  const te = req.headers["transfer-encoding"];
  const cl = req.headers["content-length"];
  if (te !== undefined) {
    // llhttp refuses Content-Length beside it; this holds for any parser.
    if (cl !== undefined || String(te).trim().toLowerCase() !== "chunked")
      return refuse(
        "malformed_request",
        "The gateway forwards a request body framed by Content-Length or by Transfer-Encoding: chunked alone; other transfer codings, and both length headers together, are refused.",
      );
    return framed({ kind: "chunked" });
  }
  if (cl !== undefined) {
    if (!/^\d{1,15}$/.test(cl))
      return refuse("malformed_request", "Content-Length must be one decimal number of bytes.");
    const length = Number(cl);
    return framed(length === 0 ? { kind: "none" } : { kind: "length", length });
  }
  // HTTP/1.x without either header has no body; HTTP/2 has one unless the HEADERS ended the stream.
  const h2 = "stream" in req && req.httpVersionMajor === 2;
  if (!h2 || req.stream.endAfterHeaders) return framed({ kind: "none" });
  // A GET whose HEADERS left the stream open usually ends it with an empty DATA frame: no body, and a
  // DATA byte that comes anyway is refused by FramedBody before anything is written.
  return framed(BODYLESS.has((req.method ?? "GET").toUpperCase()) ? { kind: "none" } : { kind: "chunked" });
}

/**
 * The headers to send upstream for this framing: the client's length and expectation headers are
 * dropped (the gateway answered any `Expect: 100-continue` itself) and the gateway's own are set.
 */
export function framedHeaders<T extends Record<string, unknown>>(headers: T, framing: Framing, pooled: boolean): T {
  const out: Record<string, unknown> = { ...headers };
  delete out["content-length"];
  delete out["transfer-encoding"];
  delete out["expect"];
  if (framing.kind === "length") out["content-length"] = String(framing.length);
  if (framing.kind === "chunked") out["transfer-encoding"] = "chunked";
  if (!pooled) out["connection"] = "close";
  return out as T;
}

/** The framing's refusal of a body that does not fit it (more bytes than stated, or any where none may be). */
export class FramingError extends Error {
  constructor(readonly error: BothyError) {
    super(error.message);
  }
}

/**
 * Passes a body on while it fits its framing: a byte past the stated length (or any byte of a
 * request without a body) fails the stream before it is passed on; a body that ends short fails it
 * at the end. Either way the upstream request must then be destroyed, never finished.
 */
export class FramedBody extends Transform {
  private seen = 0;
  constructor(private readonly framing: Framing) {
    super();
  }
  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    this.seen += chunk.length;
    const limit = this.framing.kind === "none" ? 0 : this.framing.kind === "length" ? this.framing.length : Infinity;
    if (this.seen > limit)
      return done(
        new FramingError(
          new BothyError(
            "malformed_request",
            this.framing.kind === "none"
              ? "This request may not carry a body (HTTP/2 DATA after a GET, HEAD or TRACE); it was not sent. Send the body with POST."
              : `The body is longer than its Content-Length (${limit}); it was not sent.`,
          ),
        ),
      );
    done(null, chunk);
  }
  override _flush(done: TransformCallback): void {
    if (this.framing.kind === "length" && this.seen !== this.framing.length)
      return done(
        new FramingError(
          new BothyError(
            "malformed_request",
            `The body ended after ${this.seen} of its ${this.framing.length} bytes; it was not sent.`,
          ),
        ),
      );
    done();
  }
}

function framed(framing: Framing): FramingVerdict {
  return { ok: true, framing, pooled: false };
}

function refuse(code: "malformed_request" | "method_not_allowed", message: string): FramingVerdict {
  return { ok: false, error: new BothyError(code, message) };
}

/**
 * A whole HTTP/1.1 answer carrying a problem, for a raw socket (a refused upgrade, a request the
 * parser could not read): the connection closes after it, since nothing after it can be trusted.
 */
export function closingAnswer(status: number, text: string): string {
  return `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ""}\r\ncontent-type: application/problem+json\r\ncontent-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`;
}

export const closingProblem = (problem: { status: number }): string =>
  closingAnswer(problem.status, JSON.stringify(problem));

/**
 * The answer to a request Node's parser refused (both length headers, a duplicate Content-Length, a
 * transfer coding other than chunked, a malformed line): 400, and the connection closes.
 */
export function parseErrorAnswer(err: Error & { code?: string }): string | undefined {
  if (typeof err.code !== "string" || !err.code.startsWith("HPE_")) return undefined;
  const error =
    err.code === "HPE_HEADER_OVERFLOW"
      ? new BothyError("headers_too_large", "The request's headers are larger than the gateway reads; it was not sent.")
      : new BothyError(
          "malformed_request",
          `The gateway could not read this HTTP request (${err.code}); it was not sent. Frame a body with one Content-Length or with Transfer-Encoding: chunked alone, and send well-formed header lines.`,
        );
  return closingProblem(toProblem(error));
}
