/**
 * The first bytes of a request's body, read before the request is decided (an approval shows
 * them), without losing them: the body is handed on whole afterwards.
 */
import { Readable } from "node:stream";

/**
 * Reads until `max` bytes or the end of `req`'s body. `body` is what to read the whole body
 * from from now on: `req` itself with the bytes put back, or, when the body ended within
 * `max` (a stream cannot be put back after its end), a stream of those bytes.
 */
export function peekBody(req: Readable, max: number): Promise<{ excerpt: Buffer; body: Readable }> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const settle = (ended: boolean): void => {
      req.off("data", onData);
      req.off("end", onEnd);
      req.off("error", onFail);
      req.off("close", onFail);
      const read = Buffer.concat(chunks);
      if (ended) return resolve({ excerpt: read.subarray(0, max), body: Readable.from(read.length > 0 ? [read] : []) });
      req.pause();
      if (read.length > 0 && !req.destroyed) req.unshift(read);
      resolve({ excerpt: read.subarray(0, max), body: req });
    };
    const onData = (chunk: Buffer): void => {
      chunks.push(chunk);
      size += chunk.length;
      if (size >= max) settle(false);
    };
    const onEnd = (): void => settle(true);
    // A body that fails or goes away is handed on as it is: its reader sees the failure.
    const onFail = (): void => settle(false);
    req.on("data", onData);
    req.once("end", onEnd);
    req.once("error", onFail);
    req.once("close", onFail);
  });
}
