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
