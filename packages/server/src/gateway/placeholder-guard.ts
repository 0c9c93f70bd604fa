/**
 * A secret's placeholder never goes out in clear HTTP: where one shows in a request's URL or
 * headers, and a stream that passes a body on unchanged but fails at a placeholder in it. Secrets
 * only go out over HTTPS, swapped in by the TLS terminator for the hosts they are bound to.
 */
import type { IncomingMessage } from "node:http";
import { Transform, type TransformCallback } from "node:stream";
import { PLACEHOLDER_PREFIX } from "@bothy/protocol";

/** The name of a header (or `url`) that carries a secret's placeholder, if any. */
export function placeholderIn(req: IncomingMessage): string | undefined {
  if ((req.url ?? "").includes(PLACEHOLDER_PREFIX)) return "a placeholder in the URL";
  for (let i = 0; i < req.rawHeaders.length; i += 2)
    if (req.rawHeaders[i + 1]?.includes(PLACEHOLDER_PREFIX))
      return `a placeholder in header ${req.rawHeaders[i]?.toLowerCase()}`;
  return undefined;
}

/** Passes a body on unchanged, failing at a placeholder (also one split across chunks). */
export class PlaceholderGuard extends Transform {
  private tail = "";
  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    const text = this.tail + chunk.toString("latin1");
    if (text.includes(PLACEHOLDER_PREFIX)) return done(new Error("a placeholder in the body"));
    this.tail = text.slice(-(PLACEHOLDER_PREFIX.length - 1));
    done(null, chunk);
  }
}
