import { chmod, copyFile, mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { noLeaks } from "./helpers/host-state.ts";
import { api } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

/**
 * Real failures, not simulated ones, on every driver: a root tree without the agent's Node (runsc
 * cannot start the process; a QEMU guest powers off) and a tree whose "node" starts but never
 * speaks (the handshake times out with a live container or VM that must be torn down).
 */
for (const driver of testDrivers()) {
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "failed creates"), () => {
    let ts: TestServer;
    let trees: string;

    beforeAll(async () => {
      trees = await mkdtemp("/tmp/bothy-broken-");
      const empty = join(trees, "empty");
      await mkdir(join(empty, "workspace"), { recursive: true });
      await mkdir(join(empty, "opt/bothy"), { recursive: true });

      const mute = join(trees, "mute");
      for (const d of ["bin", "usr/bin", "workspace", "opt/bothy", "proc", "dev", "sys"])
        await mkdir(join(mute, d), { recursive: true });
      await copyFile("/bin/busybox", join(mute, "bin/busybox"));
      await symlink("busybox", join(mute, "bin/sh"));
      await writeFile(join(mute, "usr/bin/node"), "#!/bin/sh\nexec /bin/busybox sleep 300\n");
      await chmod(join(mute, "usr/bin/node"), 0o755);

      ts = await startTestServer(
        { BOTHY_BOOT_TIMEOUT_S: "2", BOTHY_DRIVER: driver.name },
        {
          resolve: async (name) =>
            name === "no-node"
              ? { name, hash: "test-empty", rootfs: empty, env: {} }
              : name === "mute"
                ? { name, hash: "test-mute", rootfs: mute, env: {} }
                : undefined,
        },
      );
    });

    afterAll(async () => {
      expect(await ts.stop()).toEqual(noLeaks());
      await rm(trees, { recursive: true, force: true });
    });

    describe("a create that fails leaves nothing behind", () => {
      for (const template of ["no-node", "mute"]) {
        it(`template ${template}`, async () => {
          const key = `fail-${template}`;
          const res = await api(ts.url, "POST", "/sandboxes", { template }, { "idempotency-key": key });
          expect(res.status).toBe(500);
          expect(res.type).toContain("application/problem+json");
          expect(res.json["code"]).toBe("create_failed");
          // The client learns which step failed; what the driver or guest printed goes to the log.
          expect(res.json["detail"]).toMatch(/\bsbx_\w+\b/);
          expect(res.json["detail"]).not.toMatch(/driver said|console:|runsc |Error:|\//);
          // The log line has the internal error and, when it has one, its cause chain (`<- ...`); which
          // step fails first (the exit or the handshake) is a race, so the chain's length is not checked.
          const logged = ts.events.flatMap((e) => (e.event === "sandbox_create_failed" ? [e.error] : []));
          expect(logged.at(-1)).toMatch(/^BootError: Could not|^BootError: Sandbox sbx_/);

          const { hostLeaks } = await import("./helpers/host-state.ts");
          const leaks = await hostLeaks(ts.home);
          expect({ ...leaks, runscProcesses: leaks.runscProcesses }).toEqual(noLeaks());
          const rows = (await ts.server.ledger.listSandboxes({ includeDeleted: true })).filter(
            (r) => r.template === template,
          );
          expect(rows.every((r) => r.state === "failed")).toBe(true);

          // The key of a failed create is free again: the retry really tries (and fails) again.
          const retry = await api(ts.url, "POST", "/sandboxes", { template }, { "idempotency-key": key });
          expect(retry.status).toBe(500);
        });
      }
    });
  });
}
