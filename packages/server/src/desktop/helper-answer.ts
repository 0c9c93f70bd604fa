/**
 * One call to the desktop helper's server inside the sandbox (packages/guest/src/desktop-main.ts):
 * a JSON request line out; back a JSON report line, then as many bytes as its `bytes` field names
 * (a screenshot's PNG; none for input). The sandbox writes the answer, so every part is bounded and
 * checked: the line's length, the body's size, and for a screenshot the PNG's signature and the
 * size in its header against the report's; the whole call has a deadline.
 */
import type { Duplex } from "node:stream";
import { z } from "zod";
import { BothyError } from "@bothy/protocol";

const MAX_LINE_BYTES = 1024;
const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

const failure = z.object({ ok: z.literal(false), error: z.string(), message: z.string().optional() });
export type HelperFailure = z.infer<typeof failure>;
const shotReport = z.union([
  z.object({
    ok: z.literal(true),
    width: z.number().int().positive(),
    height: z.number().int().positive(),
    bytes: z.number().int().positive(),
  }),
  failure,
]);
const inputReport = z.union([z.object({ ok: z.literal(true) }), failure]);

export type Shot = { ok: true; png: Buffer; width: number; height: number } | HelperFailure;

export type HelperRequest = { do: "shot" } | { do: "input"; lines: string[] };

function bad(why: string): BothyError {
  return new BothyError("desktop_failed", `The desktop helper in the sandbox answered badly: ${why}.`);
}

/** The PNG's own width and height (its IHDR chunk, which must come first). */
function pngSize(png: Buffer): { width: number; height: number } | undefined {
  if (png.length < 24 || !png.subarray(0, 8).equals(PNG_SIGNATURE) || png.toString("latin1", 12, 16) !== "IHDR")
    return undefined;
  return { width: png.readUInt32BE(16), height: png.readUInt32BE(20) };
}

/** Sends `request` and reads the report line and its body; the stream is closed after. */
export function callHelper(
  stream: Duplex,
  request: HelperRequest,
  maxBody: number,
  timeoutMs: number,
): Promise<{ report: unknown; body: Buffer }> {
  return new Promise((resolve, reject) => {
    let head = Buffer.alloc(0);
    let report: unknown;
    let want = -1;
    const body: Buffer[] = [];
    let got = 0;
    let done = false;
    const finish = (outcome: Error | { report: unknown; body: Buffer }): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      stream.destroy();
      if (outcome instanceof Error) reject(outcome);
      else resolve(outcome);
    };
    const timer = setTimeout(
      () => finish(new BothyError("desktop_failed", `The desktop helper did not answer within ${timeoutMs / 1000} s.`)),
      timeoutMs,
    );
    const complete = (): void => finish({ report, body: Buffer.concat(body).subarray(0, want) });
    /** The report line; what followed it in the same chunk is the body's start. */
    const readLine = (chunk: Buffer): Buffer | undefined => {
      head = Buffer.concat([head, chunk]);
      const nl = head.indexOf(0x0a);
      if (nl < 0) {
        if (head.length > MAX_LINE_BYTES) finish(bad("no line in its first kilobyte"));
        return undefined;
      }
      try {
        report = JSON.parse(head.toString("utf8", 0, nl));
      } catch {
        finish(bad("its first line is not JSON"));
        return undefined;
      }
      const bytes = (report as { bytes?: unknown } | null)?.bytes;
      want = typeof bytes === "number" && Number.isSafeInteger(bytes) && bytes > 0 ? bytes : 0;
      if (want > maxBody) {
        finish(bad(`a body of ${want} bytes is over ${maxBody}`));
        return undefined;
      }
      return head.subarray(nl + 1);
    };
    stream.on("data", (chunk: Buffer) => {
      const rest = want >= 0 ? chunk : readLine(chunk);
      if (done || want < 0 || !rest) return;
      body.push(rest);
      got += rest.length;
      if (got >= want) complete();
    });
    stream.on("error", (err) => finish(new BothyError("desktop_failed", `The desktop helper failed: ${err.message}`)));
    stream.on("end", () => finish(bad(want < 0 ? "it closed before its report" : "it closed before the whole body")));
    stream.write(`${JSON.stringify(request)}\n`);
  });
}

/** A screenshot's answer, checked: the report's shape, and a PNG of the size it names. */
export function checkedShot(answer: { report: unknown; body: Buffer }): Shot {
  const report = shotReport.safeParse(answer.report);
  if (!report.success) throw bad("not a screenshot report");
  if (!report.data.ok) return report.data;
  const size = pngSize(answer.body);
  if (!size || size.width !== report.data.width || size.height !== report.data.height)
    throw bad("the PNG is not the image its report names");
  return { ok: true, png: answer.body, width: report.data.width, height: report.data.height };
}

/** Input's answer, checked. */
export function checkedInput(answer: { report: unknown }): { ok: true } | HelperFailure {
  const report = inputReport.safeParse(answer.report);
  if (!report.success) throw bad("not an input report");
  return report.data;
}
