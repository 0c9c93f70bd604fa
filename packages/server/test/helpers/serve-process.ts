import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { testKernelDir, testTemplatesDir } from "../../../../test/paths.ts";

/** A `bothy serve` child process, its parsed log lines, and the address it listens on. */
export interface ServeProcess {
  child: ChildProcess;
  logs: Array<Record<string, unknown>>;
  /** Resolves with the URL from the `listening` log line; rejects if the server exits first. */
  url: Promise<string>;
  /** Resolves with the first log line of that event (one already logged too); rejects if the log ends first. */
  logged(event: string): Promise<Record<string, unknown>>;
  /** SIGTERM, then SIGKILL if it has not exited within `graceMs`. */
  stop(graceMs?: number): Promise<void>;
  /** SIGKILL (a crash, no clean stop); resolves once it has exited. */
  kill(): Promise<void>;
}

/** Follows a spawned `bothy serve` (stdout piped): every JSON log line is kept in `logs`. */
export function watchServe(child: ChildProcess): ServeProcess {
  const logs: Array<Record<string, unknown>> = [];
  const waiters = new Set<{ event: string; resolve: (entry: Record<string, unknown>) => void; reject: () => void }>();
  // The log has ended once stdout closes: after the last line, unlike the process's `exit`.
  let ended = !child.stdout;
  if (child.stdout) {
    const lines = createInterface({ input: child.stdout });
    lines.on("line", (line) => {
      const entry = JSON.parse(line) as Record<string, unknown>;
      logs.push(entry);
      for (const w of waiters)
        if (w.event === entry["event"]) {
          waiters.delete(w);
          w.resolve(entry);
        }
    });
    lines.once("close", () => {
      ended = true;
      for (const w of waiters) w.reject();
      waiters.clear();
    });
  }
  const logged = (event: string): Promise<Record<string, unknown>> =>
    new Promise((resolve, reject) => {
      const seen = logs.find((l) => l["event"] === event);
      if (seen) return resolve(seen);
      const fail = (): void =>
        reject(new Error(`bothy serve's log ended before ${event}; last logs: ${JSON.stringify(logs.slice(-3))}`));
      if (ended) return fail();
      waiters.add({ event, resolve, reject: fail });
    });
  const url = logged("listening").then((entry) => String(entry["address"]));
  url.catch(() => undefined); // a caller that never awaits it must not see an unhandled rejection
  const exited = (): boolean => child.exitCode !== null || child.signalCode !== null;
  const gone = new Promise((r) => child.once("exit", r));
  return {
    child,
    logs,
    url,
    logged,
    stop: async (graceMs = 20_000) => {
      if (exited()) return;
      child.kill("SIGTERM");
      await Promise.race([gone, new Promise((r) => setTimeout(r, graceMs))]);
      if (!exited()) child.kill("SIGKILL");
    },
    kill: async () => {
      if (exited()) return;
      child.kill("SIGKILL");
      await gone;
    },
  };
}

const BOTHY = fileURLToPath(new URL("../../../cli/bin/bothy.js", import.meta.url));

/**
 * Spawns the real `bothy serve` on loopback for a home, as the tests run it (shared templates and
 * kernel, any port, no pool, no network), `env` on top, and follows it.
 */
export function spawnTestServe(home: string, env: Record<string, string> = {}): ServeProcess {
  const child = spawn(process.execPath, [BOTHY, "serve"], {
    env: {
      ...process.env,
      BOTHY_HOME: home,
      BOTHY_TEMPLATES_DIR: testTemplatesDir(),
      BOTHY_KERNEL_DIR: testKernelDir(),
      BOTHY_PORT: "0",
      BOTHY_POOL_SIZE: "0",
      BOTHY_NETWORK: "off",
      BOTHY_LOG_LEVEL: "info",
      ...env,
    },
    stdio: ["ignore", "pipe", "inherit"],
  });
  return watchServe(child);
}
