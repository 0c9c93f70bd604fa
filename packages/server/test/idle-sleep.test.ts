import { afterAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { api, createSandbox, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { IDLE_S, useIdleServer } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

for (const driver of testDrivers()) {
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "idle sleep"), () => {
    let ts: TestServer;
    const { asleep, state, waitForState } = useIdleServer(driver.name, (s) => (ts = s));
    /** One sandbox for both tests: the second needs only one that can sleep (a VM's boot is costly). */
    let shared = "";
    const sandbox = async (): Promise<string> => (shared ||= await createSandbox(ts.url));
    afterAll(async () => {
      if (shared) await api(ts.url, "DELETE", `/sandboxes/${shared}`);
    });

    it("puts an idle sandbox to sleep and wakes it on the next call, files intact", { timeout: 300_000 }, async () => {
      const id = await sandbox();
      await runCommand(ts.wsUrl, id, { cmd: "echo kept > /workspace/note" });
      expect(await waitForState(id, asleep, IDLE_S + 30)).toBe(asleep);
      const r = await runCommand(ts.wsUrl, id, { cmd: "cat /workspace/note" });
      expect(r.stdout).toBe("kept\n");
      expect(await state(id)).toBe("running");
      // A file call wakes it too.
      expect(await waitForState(id, asleep, IDLE_S + 30)).toBe(asleep);
      const file = await fetch(`${ts.url}/sandboxes/${id}/files?path=/workspace/note`);
      expect(await file.text()).toBe("kept\n");
      expect(await state(id)).toBe("running");
    });

    it("never sleeps while a command runs or a client is attached", { timeout: 300_000 }, async () => {
      const id = await sandbox();
      // Awake before the watch starts (the first test may have left it asleep).
      expect((await runCommand(ts.wsUrl, id, { cmd: "echo awake" })).stdout).toBe("awake\n");
      // A command running three times the idle time keeps it awake throughout.
      const long = runCommand(ts.wsUrl, id, { cmd: `sleep ${IDLE_S * 3}; echo done` });
      const seen = new Set<string>();
      for (let i = 0; i < IDLE_S * 3 * 2; i++) {
        seen.add(await state(id));
        await new Promise((r) => setTimeout(r, 500));
      }
      expect((await long).stdout).toBe("done\n");
      expect([...seen]).toEqual(["running"]);

      // So does an open socket that has not sent its command yet.
      const ws = new WebSocket(`${ts.wsUrl}/sandboxes/${id}/command`);
      await new Promise((r) => ws.once("open", r));
      await new Promise((r) => setTimeout(r, (IDLE_S + 3) * 1000));
      expect(await state(id)).toBe("running");
      ws.close(1000);
      expect(await waitForState(id, asleep, IDLE_S + 30)).toBe(asleep);
    });
  });
}
