import { chmod, mkdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect } from "vitest";
import type { DriverName } from "@bothy/protocol";
import { createSandbox, sandboxState, waitForState } from "./client.ts";
import { noLeaks } from "./host-state.ts";
import { startTestServer, type TestServer } from "./test-server.ts";

/**
 * For the enclosing describe: a real server (startTestServer with `env`) before its first test,
 * and at the end the check that it left nothing on the host. `use` receives the server once it
 * exists.
 */
export function useTestServer(env: Record<string, string>, use: (ts: TestServer) => unknown): void {
  let ts: TestServer | undefined;
  beforeAll(async () => {
    ts = await startTestServer(env);
    await use(ts);
  });
  afterAll(async () => {
    expect(await ts?.stop()).toEqual(noLeaks());
  });
}

/**
 * For the enclosing describe: a real server whose default driver is `driver`, one sandbox on it,
 * and at the end the check that the server left nothing on the host. `use` receives both once
 * they exist (before the first test runs).
 */
export function useServerWithSandbox(
  driver: DriverName,
  use: (ts: TestServer, sandboxId: string) => void,
  env: Record<string, string> = {},
): void {
  useTestServer({ BOTHY_DRIVER: driver, ...env }, async (ts) => use(ts, await createSandbox(ts.url)));
}

/**
 * useServerWithSandbox on gVisor with BOTHY_AGENT_NODE set to a Node that is the server's own on the
 * host (which builds the agent's snapshot with it) but exits with `status` in the sandbox, where
 * bothy-init is: 127 as a loader refusing its libraries would (bothy-init then falls back to the
 * template's Node), any other status as a Node that cannot start at all.
 */
export function useServerWithSandboxNodeExiting(
  status: number,
  use: (ts: TestServer, sandboxId: string) => void,
  env: Record<string, string> = {},
): void {
  const dir = join(tmpdir(), `bothy-sandbox-node-${status}-${process.pid}`);
  beforeAll(async () => {
    await mkdir(dir, { recursive: true });
    await writeFile(
      join(dir, "node"),
      `#!/bin/sh\n[ -e /opt/bothy/bothy-init ] && exit ${status}\nexec ${process.execPath} "$@"\n`,
    );
    await chmod(join(dir, "node"), 0o755);
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  useServerWithSandbox("gvisor", use, { ...env, BOTHY_AGENT_NODE: join(dir, "node") });
}

/** How long a sandbox stays idle before it sleeps, on a server `useIdleServer` started. */
export const IDLE_S = 3;

/**
 * For the enclosing describe: a real server with `driver` whose sandboxes sleep after IDLE_S
 * seconds idle (swept each second), as `useTestServer`. Returns what the tests ask about sleep.
 */
export function useIdleServer(
  driver: DriverName,
  use: (ts: TestServer) => void,
): {
  /** What a sleeping sandbox's state is: QEMU keeps the VM's memory (paused); gVisor stops it and keeps its disk (stopped). */
  asleep: "paused" | "stopped";
  state(id: string): Promise<string>;
  waitForState(id: string, want: string, seconds: number): Promise<string>;
} {
  let url = "";
  useTestServer({ BOTHY_DRIVER: driver, BOTHY_IDLE_TIMEOUT_S: String(IDLE_S), BOTHY_SWEEP_INTERVAL_S: "1" }, (ts) => {
    url = ts.url;
    use(ts);
  });
  return {
    asleep: driver === "qemu" ? "paused" : "stopped",
    state: (id) => sandboxState(url, id),
    waitForState: (id, want, seconds) => waitForState(url, id, want, seconds),
  };
}
