import { execFile } from "node:child_process";

export interface HostCommandResult {
  stdout: string;
  stderr: string;
}

/** A host command that failed: which one, how, and what it printed. */
export class HostCommandError extends Error {
  constructor(
    readonly file: string,
    readonly args: readonly string[],
    readonly exitCode: number | null,
    readonly stderr: string,
    cause?: unknown,
  ) {
    super(`${file} ${args.join(" ")} failed (exit ${exitCode ?? "?"}): ${stderr.trim().slice(0, 500)}`, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
  }
}

/** Runs a host program with an argument array (never a shell), with a timeout. */
export function run(file: string, args: readonly string[], options: { timeoutMs?: number; input?: string } = {}): Promise<HostCommandResult> {
  return new Promise((resolve, reject) => {
    const child = execFile(
      file,
      args,
      { timeout: options.timeoutMs ?? 60_000, maxBuffer: 16 * 1024 * 1024, encoding: "utf8" },
      (err, stdout, stderr) => {
        if (err) {
          const code = typeof (err as { code?: unknown }).code === "number" ? ((err as { code: number }).code) : null;
          reject(new HostCommandError(file, args, code, stderr || err.message, err));
        } else resolve({ stdout, stderr });
      },
    );
    if (options.input !== undefined) child.stdin?.end(options.input);
  });
}
