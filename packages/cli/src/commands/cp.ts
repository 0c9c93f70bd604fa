import { createReadStream, createWriteStream } from "node:fs";
import { stat } from "node:fs/promises";
import { basename, join } from "node:path";
import { Readable, Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { NotFoundError, Sandbox } from "@bothy/sdk";
import { CONNECTION_FLAGS, connection, JSON_FLAG, parse, UsageError } from "../args/parse.ts";
import { createByteProgress } from "../byte-progress.ts";
import type { Command } from "../command.ts";
import { printJson } from "../output.ts";

const USAGE = `usage: bothy cp SRC DST [--json] [--quiet]

Copies a file into or out of a sandbox; the sandbox side is written ID:PATH (relative paths
are from /workspace). A local - is stdin or stdout. When DST is a directory (or ends in /),
the file keeps its name. Shows a progress bar on a terminal.

  bothy cp ./data.csv sbx_…:/workspace/      upload
  bothy cp sbx_…:out/report.pdf .            download
  -q, --quiet   no progress bar
`;

const REMOTE = /^(sbx_[a-z2-7]{20}):(.*)$/;

interface Remote {
  id: string;
  path: string;
}

function remote(arg: string): Remote | undefined {
  const m = REMOTE.exec(arg);
  return m ? { id: m[1] ?? "", path: m[2] || "/workspace/" } : undefined;
}

export const cpCommand: Command = {
  name: "cp",
  summary: "copy a file into or out of a sandbox",
  usage: USAGE,
  async run(args) {
    const { values, positionals } = parse(
      args,
      { ...CONNECTION_FLAGS, ...JSON_FLAG, quiet: { type: "boolean", short: "q" } },
      { min: 2, max: 2, names: "SRC and DST" },
    );
    if (values.help) {
      process.stdout.write(USAGE);
      return 0;
    }
    const [src = "", dst = ""] = positionals;
    const from = remote(src);
    const to = remote(dst);
    if ((from === undefined) === (to === undefined))
      throw new UsageError("exactly one of SRC and DST is in a sandbox (ID:PATH)");
    const quiet = values.quiet === true || values.json === true;
    const result = to ? await upload(src, to, values, quiet) : await download(from as Remote, dst, values, quiet);
    if (values.json) printJson(result);
    return 0;
  },
};

async function upload(
  src: string,
  to: Remote,
  values: Parameters<typeof connection>[0],
  quiet: boolean,
): Promise<{ path: string; size: number; sha256: string }> {
  const sandbox = await Sandbox.connect(to.id, connection(values));
  const name = src === "-" ? "stdin" : basename(src);
  let path = to.path;
  if (path.endsWith("/")) path += name;
  else {
    const existing = await sandbox.files.stat(path).catch((err: unknown) => {
      if (err instanceof NotFoundError) return undefined;
      throw err;
    });
    if (existing?.type === "dir") path = `${path}/${name}`;
  }
  const size = src === "-" ? undefined : (await stat(src)).size;
  const progress = quiet ? undefined : createByteProgress(name, size);
  const input = src === "-" ? process.stdin : createReadStream(src);
  async function* counted(): AsyncGenerator<Uint8Array> {
    for await (const chunk of input as AsyncIterable<Buffer>) {
      progress?.add(chunk.length);
      yield chunk;
    }
  }
  try {
    return await sandbox.files.write(path, counted());
  } finally {
    progress?.finish();
  }
}

async function download(
  from: Remote,
  dst: string,
  values: Parameters<typeof connection>[0],
  quiet: boolean,
): Promise<{ path: string; size: number }> {
  const sandbox = await Sandbox.connect(from.id, connection(values));
  const info = await sandbox.files.stat(from.path);
  if (info.type === "dir")
    throw new UsageError(
      `${from.path} is a directory; cp copies files (list it with bothy exec ${from.id} -- ls ${from.path})`,
    );
  let target = dst;
  if (dst !== "-" && (dst.endsWith("/") || (await stat(dst).catch(() => undefined))?.isDirectory()))
    target = join(dst, basename(from.path));
  const progress = quiet || dst === "-" ? undefined : createByteProgress(basename(from.path), info.size);
  const body = await sandbox.files.read(from.path, { format: "stream" });
  const source = Readable.fromWeb(body as Parameters<typeof Readable.fromWeb>[0]);
  source.on("data", (chunk: Buffer) => progress?.add(chunk.length));
  try {
    const sink =
      dst === "-"
        ? new Writable({ write: (chunk: Buffer, _enc, cb) => process.stdout.write(chunk, cb) })
        : createWriteStream(target);
    await pipeline(source, sink);
  } finally {
    progress?.finish();
  }
  return { path: dst === "-" ? "-" : target, size: info.size };
}
