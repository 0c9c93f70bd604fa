import { spawn } from "node:child_process";

const MAX_OUTPUT_BYTES = 16 * 1024 * 1024;

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
    super(
      `${file} ${args.join(" ")} failed (exit ${exitCode ?? "?"}): ${stderr.trim().slice(0, 500)}`,
      cause === undefined ? undefined : { cause },
    );
    this.name = new.target.name;
  }
}

/**
 * Runs a host program with an argument array (never a shell), with a timeout. It runs in its own
 * process group: a Ctrl-C meant for the server must not kill a mount or a runsc delete halfway;
 * the server decides when its host commands stop.
 */
export function run(
  file: string,
  args: readonly string[],
  options: { timeoutMs?: number; input?: string; cwd?: string; env?: NodeJS.ProcessEnv } = {},
): Promise<HostCommandResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, {
      cwd: options.cwd,
      ...(options.env ? { env: options.env } : {}),
      detached: true,
      stdio: [options.input === undefined ? "ignore" : "pipe", "pipe", "pipe"],
    });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let size = 0;
    const collect = (into: Buffer[]) => (chunk: Buffer) => {
      size += chunk.length;
      if (size <= MAX_OUTPUT_BYTES) into.push(chunk);
    };
    child.stdout?.on("data", collect(out));
    child.stderr?.on("data", collect(err));
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill("SIGKILL");
    }, options.timeoutMs ?? 60_000);
    child.once("error", (e) => {
      clearTimeout(timer);
      reject(new HostCommandError(file, args, null, e.message, e));
    });
    child.once("close", (code, signal) => {
      clearTimeout(timer);
      const stdout = Buffer.concat(out).toString("utf8");
      const stderr = Buffer.concat(err).toString("utf8");
      if (code === 0) return resolve({ stdout, stderr });
      const why = timedOut ? `timed out after ${options.timeoutMs ?? 60_000} ms` : signal ? `killed by ${signal}` : "";
      reject(new HostCommandError(file, args, code, `${stderr}${why ? ` (${why})` : ""}`));
    });
    if (options.input !== undefined) child.stdin?.end(options.input);
  });
}
