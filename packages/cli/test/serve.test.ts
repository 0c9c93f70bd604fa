import { type ChildProcess, execFile, spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { promisify } from "node:util";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { testTemplatesDir } from "../../../test/paths.ts";
import { createSandbox, deleteSandbox, runCommand } from "../../server/test/helpers/client.ts";
import { hostLeaks, noLeaks } from "../../server/test/helpers/host-state.ts";
import { type ServeProcess, watchServe } from "../../server/test/helpers/serve-process.ts";

const BOTHY = fileURLToPath(new URL("../bin/bothy.js", import.meta.url));
const pexec = promisify(execFile);

function serveIn(home: string): ChildProcess {
  return spawn(process.execPath, [BOTHY, "serve"], {
    env: {
      ...process.env,
      BOTHY_HOME: home,
      BOTHY_TEMPLATES_DIR: testTemplatesDir(),
      BOTHY_PORT: "0",
      BOTHY_POOL_SIZE: "1",
      BOTHY_NETWORK: "off",
    },
    stdio: ["ignore", "pipe", "inherit"],
  });
}

/** A server started on the home and stopped cleanly once it listens: its start-up reconcile cleans up. */
async function startAndStop(home: string): Promise<void> {
  const serve = watchServe(serveIn(home));
  await serve.url.finally(() => serve.stop());
}

/** The pid of the gVisor sentry (`runsc-sandbox … boot`) of a sandbox of this home, once one runs. */
async function sentryPid(home: string): Promise<number> {
  for (;;) {
    const { stdout } = await pexec("ps", ["-eo", "pid=,args="]);
    const line = stdout.split("\n").find((l) => / runsc-sandbox .* boot /.test(l) && l.includes(`${home}/`));
    if (line) return Number(line.trim().split(" ")[0]);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe("bothy serve", () => {
  it("serves the API as its own process, logs lifecycle events, and stops cleanly on SIGTERM", async () => {
    const home = await mkdtemp("/tmp/bothy-serve-");
    const child = serveIn(home);
    const { logs, url } = watchServe(child);
    const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
    try {
      const base = await url;
      const id = await createSandbox(base);
      const r = await runCommand(base.replace(/^http/, "ws"), id, { cmd: "echo served" });
      expect(r.stdout).toBe("served\n");
      expect(await deleteSandbox(base, id)).toBe("deleted");

      const events = logs.filter((l) => l["sandbox_id"] === id).map((l) => l["event"]);
      expect(events).toEqual(
        expect.arrayContaining(["sandbox_created", "command_started", "command_exited", "sandbox_deleted"]),
      );
      child.kill("SIGTERM");
      expect(await exited).toBe(0);
      expect(await hostLeaks(home)).toEqual(noLeaks());
    } finally {
      child.kill("SIGKILL");
      await rm(home, { recursive: true, force: true });
    }
  });

  /**
   * A server whose warm-pool sandbox is held still (its sentry stopped), so a clean stop cannot
   * finish until the test lets it go: every signal the test sends after `server_stopping` surely
   * arrives while the stop is under way. Whatever a cut-short stop leaves, a server started again on
   * the same home removes at start-up.
   */
  async function withHeldStop(
    body: (s: {
      home: string;
      serve: ServeProcess;
      exited: Promise<number | null>;
      release: () => void;
    }) => Promise<void>,
  ): Promise<void> {
    const home = await mkdtemp("/tmp/bothy-serve-");
    const child = serveIn(home);
    const serve = watchServe(child);
    const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
    let held: number | undefined;
    const release = (): void => {
      if (held !== undefined) process.kill(held, "SIGCONT");
      held = undefined;
    };
    try {
      await serve.url;
      held = await sentryPid(home);
      process.kill(held, "SIGSTOP");
      child.kill("SIGTERM");
      await serve.logged("server_stopping");
      await body({ home, serve, exited, release });
    } finally {
      release();
      child.kill("SIGKILL");
      await exited;
      if (JSON.stringify(await hostLeaks(home)) !== JSON.stringify(noLeaks())) await startAndStop(home);
      await rm(home, { recursive: true, force: true });
    }
  }

  it("finishes a clean stop when a second SIGTERM arrives while it runs, and says so", async () => {
    await withHeldStop(async ({ home, serve, exited, release }) => {
      serve.child.kill("SIGTERM");
      // Before the fix the second signal ended the process at once, leaving the pool sandbox.
      await Promise.race([serve.logged("server_stop_under_way").catch(() => undefined), exited]);
      release();
      expect(await exited).toBe(0);
      expect(serve.logs.filter((l) => l["event"] === "server_stop_under_way")).toHaveLength(1);
      expect(await hostLeaks(home)).toEqual(noLeaks());
    });
  });

  it("exits at once on a third signal, saying what it leaves, and the next start removes it", async () => {
    await withHeldStop(async ({ home, serve, exited, release }) => {
      serve.child.kill("SIGTERM");
      await serve.logged("server_stop_under_way");
      serve.child.kill("SIGINT");
      expect(await exited).toBe(130);
      expect((await serve.logged("server_stop_forced"))["signal"]).toBe("SIGINT");
      release();
      expect((await hostLeaks(home)).sandboxDirs).toHaveLength(1);
      await startAndStop(home);
      expect(await hostLeaks(home)).toEqual(noLeaks());
    });
  });
});
