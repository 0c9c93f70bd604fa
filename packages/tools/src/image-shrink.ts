/**
 * Smaller copies of large images for computer_view_file. bothy's own downscaler (pure JavaScript,
 * packages/guest/src/image-shrink.ts, bundled to `@bothy/guest/image-shrink.mjs`) is copied into
 * the conversation's sandbox and run there on the template's Node, which every template has (the
 * agent runs on it): so it works whatever else the template holds, and the image's bytes, which
 * the sandbox controls, are never decoded in the server.
 */
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import type { Sandbox } from "@bothy/sdk";
import { z } from "zod";
import { runToEnd } from "./sandbox-calls.ts";
import { imageType } from "./text-view.ts";
import { shellQuote } from "./tool-context.ts";

/** The downscaler's peak memory per pixel, measured on generated images: ~38 bytes for a JPEG (jpeg-js), ~20 for a PNG. */
const BYTES_PER_PIXEL = 40;
/** Memory left to the sandbox's own processes and the downscaler's Node itself. */
const RESERVED_MIB = 160;
const MIN_PIXELS = 1_000_000;
const MAX_PIXELS = 24_000_000;
const SHRINK_TIMEOUT_S = 60;

/** The largest image (in pixels) the downscaler may decode in a sandbox of this much memory. */
export function pixelBudget(memoryMib: number): number {
  const fits = Math.floor(((memoryMib - RESERVED_MIB) * 1024 * 1024) / BYTES_PER_PIXEL);
  return Math.min(MAX_PIXELS, Math.max(MIN_PIXELS, fits));
}

const int = z.number().int().nonnegative();
/** The downscaler's one line of output; it ran in the sandbox, so it is checked like any input. */
export const shrinkReport = z.discriminatedUnion("shrunk", [
  z.object({
    shrunk: z.literal(true),
    format: z.enum(["png", "jpeg"]),
    width: int,
    height: int,
    out_width: int,
    out_height: int,
    out_bytes: int,
    quality: int,
  }),
  z.object({
    shrunk: z.literal(false),
    reason: z.enum([
      "unsupported_format",
      "no_dimensions",
      "too_many_pixels",
      "undecodable",
      "output_too_large",
      "file_too_large",
    ]),
    format: z.enum(["png", "jpeg"]).optional(),
    width: int.optional(),
    height: int.optional(),
    max_pixels: int.optional(),
    bytes: int.optional(),
    max_bytes: int.optional(),
  }),
]);
export type ShrinkReport = z.infer<typeof shrinkReport>;
type ShrinkFailure = Extract<ShrinkReport, { shrunk: false }>;

export type ShrinkOutcome =
  | { shrunk: true; jpeg: Buffer; width: number; height: number; outWidth: number; outHeight: number }
  /** `why` completes "could not be shrunk because …". */
  | { shrunk: false; reason: ShrinkFailure["reason"] | "not_built" | "failed"; why: string };

const millions = (n: number): string => `${(n / 1_000_000).toFixed(1)} million`;

/** Why the downscaler refused, worded for the model; `mediaType` is what the tool sniffed. */
export function failureText(report: ShrinkFailure, mediaType: string, memoryMib: number, maxBytes: number): string {
  const name = report.format === "jpeg" ? "JPEG" : "PNG";
  switch (report.reason) {
    case "unsupported_format":
      return `bothy's downscaler reads only PNG and JPEG, and this is ${mediaType}`;
    case "no_dimensions":
      return `its ${name} header gives no width and height (a damaged file?)`;
    case "too_many_pixels":
      return `it is ${report.width ?? "?"}x${report.height ?? "?"} px (${millions((report.width ?? 0) * (report.height ?? 0))} pixels), more than the ${millions(report.max_pixels ?? 0)} a sandbox with ${memoryMib} MiB of memory can decode safely`;
    case "file_too_large":
      return `the file (${report.bytes ?? "?"} bytes) is larger than any image within the pixel budget of a sandbox with ${memoryMib} MiB of memory can be (${report.max_bytes ?? "?"} bytes)`;
    case "undecodable":
      return `its ${name} data could not be decoded (damaged, or a variant the downscaler does not read, such as an arithmetic-coded JPEG)`;
    case "output_too_large":
      return `no JPEG copy of it, down to 64 px a side, fits in ${maxBytes} bytes`;
  }
}

let bundle: Promise<Buffer> | undefined;
function shrinker(): Promise<Buffer> {
  bundle ??= (async () => readFile(createRequire(import.meta.url).resolve("@bothy/guest/image-shrink.mjs")))();
  // A failed read is not cached: `npm run build` may fix it while the server runs.
  bundle.catch(() => (bundle = undefined));
  return bundle;
}

/**
 * A JPEG copy of the image at `path` in the sandbox, its longest side at most `maxSide` and its
 * size at most `maxBytes`, or why there is none. The downscaler and its copy are removed after.
 */
export async function shrinkInSandbox(
  sandbox: Sandbox,
  path: string,
  mediaType: string,
  limits: { maxSide: number; maxBytes: number },
): Promise<ShrinkOutcome> {
  let script: Buffer;
  try {
    script = await shrinker();
  } catch {
    // Only a missing build makes the bundle unreadable; the result says so.
    return {
      shrunk: false,
      reason: "not_built",
      why: "bothy's image downscaler is not built on this server (its operator runs `npm run build`)",
    };
  }
  const memoryMib = sandbox.info.memory_mib;
  const maxPixels = pixelBudget(memoryMib);
  const tag = randomBytes(6).toString("hex");
  const scriptPath = `/tmp/bothy-shrink-${tag}.mjs`;
  const out = `/tmp/bothy-view-${tag}.jpg`;
  try {
    await sandbox.files.write(scriptPath, script);
    let stdout = "";
    const done = await runToEnd(
      sandbox,
      ["/usr/bin/node", scriptPath, path, out, limits.maxSide, limits.maxBytes, maxPixels]
        .map((a) => shellQuote(String(a)))
        .join(" "),
      {
        cwd: "/",
        timeoutS: SHRINK_TIMEOUT_S,
        keepOutput: false,
        onStdout: (text) => {
          if (stdout.length < 4096) stdout += text;
        },
      },
    );
    const failed = (why: string): ShrinkOutcome => ({ shrunk: false, reason: "failed", why });
    if (done.timedOut) return failed(`the downscaler did not finish within ${SHRINK_TIMEOUT_S} s`);
    if (done.exitCode !== 0)
      return failed(
        done.signal === "SIGKILL"
          ? `the downscaler was killed (out of memory? this sandbox has ${memoryMib} MiB)`
          : `the downscaler ended with ${done.signal ? `signal ${done.signal}` : `exit code ${String(done.exitCode)}`}`,
      );
    const report = parseReport(stdout);
    if (!report) return failed("the downscaler's report could not be read");
    if (!report.shrunk)
      return {
        shrunk: false,
        reason: report.reason,
        why: failureText(report, mediaType, memoryMib, limits.maxBytes),
      };
    const jpeg = Buffer.from(await sandbox.files.read(out, { format: "bytes" }));
    // The copy comes from the sandbox too: check its kind and size, without decoding it.
    if (jpeg.length > limits.maxBytes || imageType(jpeg) !== "image/jpeg")
      return failed("the downscaler's copy was not a JPEG within the size limit");
    return {
      shrunk: true,
      jpeg,
      width: report.width,
      height: report.height,
      outWidth: report.out_width,
      outHeight: report.out_height,
    };
  } finally {
    await runToEnd(sandbox, `rm -f ${scriptPath} ${out}`, { cwd: "/", timeoutS: 10 }).catch(() => undefined);
  }
}

function parseReport(stdout: string): ShrinkReport | undefined {
  const line = stdout.trim().split("\n").pop() ?? "";
  try {
    const parsed = shrinkReport.safeParse(JSON.parse(line));
    return parsed.success ? parsed.data : undefined;
  } catch {
    // not JSON: the caller says the report could not be read
    return undefined;
  }
}
