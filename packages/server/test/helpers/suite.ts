import { afterAll, beforeAll, expect } from "vitest";
import type { DriverName } from "@bothy/protocol";
import { createSandbox } from "./client.ts";
import { noLeaks } from "./host-state.ts";
import { startTestServer, type TestServer } from "./test-server.ts";

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
  let ts: TestServer | undefined;
  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: driver, ...env });
    use(ts, await createSandbox(ts.url));
  });
  afterAll(async () => {
    expect(await ts?.stop()).toEqual(noLeaks());
  });
}
