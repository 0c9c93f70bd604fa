/**
 * What the E2B surface keeps beyond bothy's rows outlives the server (gVisor, a real `bothy serve`
 * and the unmodified `e2b` SDK): the create's envVars still reach commands after a SIGKILL and
 * after a graceful stop (the sandbox woken on its disk); a process started before a SIGKILL, which
 * runs on in the guest while the restarted server takes the sandbox over, can still be killed by
 * its pid.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { Sandbox } from "e2b";
import { afterAll, describe, expect, it } from "vitest";
import { driverTitle, testDriver } from "./helpers/drivers.ts";
import { useE2bEnv } from "./helpers/e2b-env.ts";
import { hostLeaks, noLeaks } from "./helpers/host-state.ts";
import { spawnTestServe, type ServeProcess } from "./helpers/serve-process.ts";

const gvisor = testDriver("gvisor");

describe.skipIf(gvisor.missing !== undefined)(driverTitle(gvisor, "E2B state across restarts"), () => {
  let home = "";
  let serve: ServeProcess | undefined;
  let restoreEnv: (() => void) | undefined;

  afterAll(async () => {
    restoreEnv?.();
    if (!home) return;
    // After a failure, a server on the home takes over what a killed one left, and its stop ends it.
    const child = serve?.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) await start();
    await serve?.stop();
    await rm(home, { recursive: true, force: true });
  }, 180_000);

  async function start(): Promise<string> {
    serve = spawnTestServe(home, { BOTHY_DRIVER: "gvisor" });
    const url = await serve.url;
    restoreEnv?.();
    restoreEnv = useE2bEnv(url);
    return url;
  }

  it("keeps the create's envVars and the pid map across a SIGKILL and a graceful stop", async () => {
    home = await mkdtemp("/tmp/bothy-test-e2b-restart-");
    await start();
    const created = await Sandbox.create("base", { envs: { FROM_CREATE: "kept-across-restarts" }, timeoutMs: 600_000 });
    const id = created.sandboxId;
    expect((await created.commands.run("echo $FROM_CREATE")).stdout).toBe("kept-across-restarts\n");
    const sleeper = await created.commands.run("sleep 600", { background: true });
    const alive = async (sbx: Sandbox): Promise<boolean> =>
      (await sbx.commands.run(`kill -0 -- -${sleeper.pid} 2>/dev/null && echo yes || echo no`)).stdout === "yes\n";

    // A crash: the sandbox runs on and the next server takes it over; the sleeper runs on in it, detached.
    await serve?.kill();
    await start();
    let sbx = await Sandbox.connect(id);
    expect((await sbx.commands.run("echo $FROM_CREATE")).stdout).toBe("kept-across-restarts\n");
    expect(await alive(sbx)).toBe(true);
    expect(await sbx.commands.kill(sleeper.pid)).toBe(true);
    expect(await alive(sbx)).toBe(false);
    expect(await sbx.commands.kill(sleeper.pid)).toBe(false); // gone: not found, as in envd

    // A graceful stop: the sandbox is stopped with its disk and woken by the next call.
    await serve?.stop();
    await start();
    sbx = await Sandbox.connect(id);
    expect((await sbx.commands.run("echo $FROM_CREATE")).stdout).toBe("kept-across-restarts\n");
    await sbx.kill();

    await serve?.stop();
    expect(await hostLeaks(home)).toEqual(noLeaks());
    await rm(home, { recursive: true, force: true });
    home = "";
  }, 400_000);
});
