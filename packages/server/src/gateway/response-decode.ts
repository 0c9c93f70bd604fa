/**
 * Responses the gateway scrubs must be read as the upstream's plain bytes: it asks for
 * `accept-encoding: identity`, but an upstream may compress anyway (`content-encoding`, or a
 * coding in `transfer-encoding` before `chunked`), and the scrubber cannot find a value in
 * compressed bytes. Such a body is decoded here (gzip, deflate, br; stacked codings in reverse
 * order) and passed on uncompressed; a coding it cannot decode is refused before anything of the
 * body goes to the client, and bytes that do not decode end the response (they are never passed
 * through as they came).
 */
import type { IncomingHttpHeaders } from "node:http";
import type { Readable, Transform } from "node:stream";
import zlib from "node:zlib";

/** Truncated streams decode as far as they go, as browsers and undici do. */
const decoders: Record<string, () => Transform> = {
  gzip: () => zlib.createGunzip({ finishFlush: zlib.constants.Z_SYNC_FLUSH }),
  "x-gzip": () => zlib.createGunzip({ finishFlush: zlib.constants.Z_SYNC_FLUSH }),
  // Raw deflate (no zlib header) fails the header check: the response ends, nothing passes.
  deflate: () => zlib.createInflate({ finishFlush: zlib.constants.Z_SYNC_FLUSH }),
  br: () => zlib.createBrotliDecompress({ finishFlush: zlib.constants.BROTLI_OPERATION_FLUSH }),
};

/** More layers than this are no real server's answer. */
const MAX_CODINGS = 3;

/** Headers that describe the encoded bytes and are wrong once the body is decoded. */
const ENCODED_ONLY = ["content-encoding", "content-md5", "content-digest"];

export type Decoded = { ok: true; headers: IncomingHttpHeaders; body: Readable } | { ok: false; coding: string };

function codings(value: string | string[] | undefined): string[] {
  const list = Array.isArray(value) ? value.join(",") : (value ?? "");
  return list
    .split(",")
    .map((s) => s.trim().toLowerCase())
    .filter((s) => s !== "" && s !== "identity");
}

/**
 * The response's body as plain bytes and the headers that describe it, or the coding that
 * cannot be decoded. `bodyless`: a HEAD request or a status without a body (nothing to decode;
 * the coding header goes all the same, since a GET through the gateway comes back decoded).
 * `onError` hears a body that does not decode.
 */
export function decodedResponse(
  res: Readable & { headers: IncomingHttpHeaders },
  bodyless: boolean,
  onError: (err: Error) => void,
): Decoded {
  const transfer = codings(res.headers["transfer-encoding"]).filter((c) => c !== "chunked");
  const content = codings(res.headers["content-encoding"]);
  // Transfer codings were applied last, so they come off first; each list in reverse order.
  const order = [...transfer.reverse(), ...content.reverse()];
  if (order.length === 0) return { ok: true, headers: res.headers, body: res };
  if (order.length > MAX_CODINGS) return { ok: false, coding: order.join(", ") };
  const unknown = order.find((c) => decoders[c] === undefined);
  if (unknown !== undefined) return { ok: false, coding: unknown };
  const headers = { ...res.headers };
  for (const h of ENCODED_ONLY) delete headers[h];
  if (bodyless) return { ok: true, headers, body: res };
  let body: Readable = res;
  for (const c of order) {
    const step = decoders[c]!();
    step.once("error", onError);
    body = body.pipe(step);
  }
  return { ok: true, headers, body };
}

/** Whether a response to `method` with `status` has no body (RFC 9110 6.4.1). */
export const isBodyless = (method: string, status: number): boolean =>
  method.toUpperCase() === "HEAD" || status === 204 || status === 304 || (status >= 100 && status < 200);
