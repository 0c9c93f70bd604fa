import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Sandbox, SandboxError } from "e2b";
import { pollUntil } from "./helpers/client.ts";
import { useE2bEnv } from "./helpers/e2b-env.ts";
import { driverTitle, testDriver } from "./helpers/drivers.ts";
import { noLeaks } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

const qemu = testDriver("qemu");
/** Returns once the background counting loop has written its first number. */
const LOOP_COUNTS = "while [ ! -s /tmp/count ]; do sleep 0.1; done";

/** The real `e2b` SDK's pause and resume, which bothy serves on QEMU (it saves the VM's memory). */
describe.skipIf(qemu.missing !== undefined)(driverTitle(qemu, "E2B pause and connect (e2b SDK, QEMU)"), () => {
  let ts: TestServer;
  let restoreEnv: (() => void) | undefined;

  beforeAll(async () => {
    // Swept each second: a timeout made to pass (below) is acted on at once.
    ts = await startTestServer({ BOTHY_DRIVER: "qemu", BOTHY_SWEEP_INTERVAL_S: "1" });
    restoreEnv = useE2bEnv(ts.url);
  });

  afterAll(async () => {
    restoreEnv?.();
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  it("pause keeps files and running processes; a second pause is false; connect resumes", async () => {
    const sbx = await Sandbox.create("base", { metadata: { case: "pause" } });
    try {
      await sbx.files.write("kept.txt", "before pause");
      const counter = await sbx.commands.run("i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done", {
        background: true,
        timeoutMs: 0,
      });
      // Its start event comes before the shell's first write: pause only once the loop counts.
      await sbx.commands.run(LOOP_COUNTS);
      expect(await sbx.pause()).toBe(true);
      expect(await sbx.pause()).toBe(false);
      expect((await sbx.getInfo()).state).toBe("paused");
      const paused = await Sandbox.list({ query: { metadata: { case: "pause" }, state: ["paused"] } }).nextItems();
      expect(paused.map((s) => s.sandboxId)).toEqual([sbx.sandboxId]);
      expect(await sbx.getMetrics()).toEqual([]);
      // Created without lifecycle.autoResume: other calls wait for connect, as on E2B.
      await expect(sbx.commands.run("true")).rejects.toBeInstanceOf(SandboxError);
      expect((await sbx.getInfo()).state).toBe("paused");

      const resumed = await Sandbox.connect(sbx.sandboxId);
      expect((await resumed.getInfo()).state).toBe("running");
      expect(await resumed.files.read("kept.txt")).toBe("before pause");
      // The loop from before the pause still runs in the resumed VM.
      const first = Number((await resumed.commands.run("cat /tmp/count")).stdout);
      const later = await resumed.commands.run(
        `while [ "$(cat /tmp/count)" -le ${first} ]; do sleep 0.1; done; echo moved`,
      );
      expect(later.stdout).toBe("moved\n");
      // It runs on, but bothy lets go of commands across a pause: it can no longer be attached to.
      await expect(resumed.commands.connect(counter.pid)).rejects.toThrow();
    } catch (err) {
      console.error(`failed with sandbox ${sbx.sandboxId}`);
      throw err;
    } finally {
      await sbx.kill();
    }
  });

  it("onTimeout pause keeps memory: the loop started before the timeout runs on after auto-resume", async () => {
    const sbx = await Sandbox.create("base", {
      timeoutMs: 600_000,
      lifecycle: { onTimeout: "pause", autoResume: true },
    });
    try {
      await sbx.commands.run("i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done", {
        background: true,
        timeoutMs: 0,
      });
      await sbx.commands.run(LOOP_COUNTS);
      // Its timeout passes now; the sweeper pauses it (memory saved) instead of killing it.
      await ts.server.ledger.setExpiresAt(sbx.sandboxId, new Date(Date.now() - 1000).toISOString());
      await pollUntil(
        "paused after its timeout",
        async () =>
          (await ts.server.ledger.getSandbox(sbx.sandboxId))?.state === "paused" &&
          (await ts.server.ledger.lifecycle.of(sbx.sandboxId))?.asleep_by === "timeout",
        120_000,
      );
      // The next call resumes it; the loop from before the timeout still counts.
      const first = Number((await sbx.commands.run("cat /tmp/count")).stdout);
      expect(first).toBeGreaterThan(0);
      const later = await sbx.commands.run(
        `while [ "$(cat /tmp/count)" -le ${first} ]; do sleep 0.1; done; echo moved`,
      );
      expect(later.stdout).toBe("moved\n");
      expect((await sbx.getInfo()).endAt.getTime()).toBeGreaterThan(Date.now() + 500_000);
    } catch (err) {
      console.error(`failed with sandbox ${sbx.sandboxId}`);
      throw err;
    } finally {
      await sbx.kill();
    }
  });
});
