import type { ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";

/** A `bothy serve` child process, its parsed log lines, and the address it listens on. */
export interface ServeProcess {
  child: ChildProcess;
  logs: Array<Record<string, unknown>>;
  /** Resolves with the URL from the `listening` log line; rejects if the server exits first. */
  url: Promise<string>;
  /** SIGTERM, then SIGKILL if it has not exited within `graceMs`. */
  stop(graceMs?: number): Promise<void>;
}

/** Follows a spawned `bothy serve` (stdout piped): every JSON log line is kept in `logs`. */
export function watchServe(child: ChildProcess): ServeProcess {
  const logs: Array<Record<string, unknown>> = [];
  const url = new Promise<string>((resolve, reject) => {
    child.once("exit", (code) =>
      reject(new Error(`bothy serve exited (${code}); last logs: ${JSON.stringify(logs.slice(-3))}`)),
    );
    if (!child.stdout) return reject(new Error("bothy serve was started without a stdout pipe"));
    createInterface({ input: child.stdout }).on("line", (line) => {
      const entry = JSON.parse(line) as Record<string, unknown>;
      logs.push(entry);
      if (entry["event"] === "listening") resolve(String(entry["address"]));
    });
  });
  url.catch(() => undefined); // a caller that never awaits it must not see an unhandled rejection
  const exited = (): boolean => child.exitCode !== null || child.signalCode !== null;
  return {
    child,
    logs,
    url,
    stop: async (graceMs = 20_000) => {
      if (exited()) return;
      const gone = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      await Promise.race([gone, new Promise((r) => setTimeout(r, graceMs))]);
      if (!exited()) child.kill("SIGKILL");
    },
  };
}
