/**
 * `sandbox.pty`: an interactive shell (or any command) on a pseudo-terminal. Output arrives as
 * raw bytes (stdout and stderr together, with the terminal's echo); input goes in with
 * `sendStdin`, window changes with `resize`, Ctrl-C as the byte "\x03" or `kill("SIGINT")`.
 */
import type { CommandHandle } from "./commands.ts";
import type { Commands } from "./commands.ts";
import type { CallOptions } from "./http-client.ts";

/** A login shell: bash where the template has it, else sh. */
export const DEFAULT_PTY_COMMAND = "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi";

export interface PtyOptions extends CallOptions {
  cols: number;
  rows: number;
  /** The terminal's output, as bytes. */
  onData: (data: Uint8Array) => void;
  /** What to run on the terminal (default: a login shell). */
  cmd?: string;
  cwd?: string;
  /** Added to the command's environment; TERM defaults to xterm-256color. */
  env?: Record<string, string>;
  timeoutS?: number;
  /** Keep the shell running when this client's socket closes (re-attach with commands.connect). */
  background?: boolean;
}

export class Pty {
  /** @internal */
  constructor(private readonly commands: Commands) {}

  /**
   * Starts `cmd` (a login shell by default) on a terminal of `cols` x `rows` and answers its
   * handle once it runs; `handle.wait()` resolves when it exits, with its exit status (a PTY
   * command does not throw on a non-zero exit).
   */
  async create(options: PtyOptions): Promise<CommandHandle> {
    return this.commands.start(
      options.cmd ?? DEFAULT_PTY_COMMAND,
      {
        ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
        env: { TERM: "xterm-256color", ...options.env },
        ...(options.timeoutS === undefined ? {} : { timeoutS: options.timeoutS }),
        ...(options.signal === undefined ? {} : { signal: options.signal }),
        ...(options.background ? { background: true } : {}),
        onOutput: (bytes) => options.onData(bytes),
        throwOnError: false,
      },
      { pty: { cols: options.cols, rows: options.rows } },
    );
  }
}
