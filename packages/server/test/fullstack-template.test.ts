import { afterAll, describe, expect, it } from "vitest";
import { api, createSandbox, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { IDLE_S, useIdleServer } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

/**
 * The fullstack template (templates/fullstack, built by test/global-setup.ts): PostgreSQL and
 * Redis start with one command each, are used from a small script, and are still there, with
 * their data, after the sandbox slept and woke. On QEMU sleep keeps the VM's memory, so they never
 * stopped; on gVisor sleep stops the sandbox and wake boots it again on its kept disk, where the
 * template's boot hook starts again what `bothy-service start` started.
 */
for (const driver of testDrivers()) {
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "fullstack template"), () => {
    let ts: TestServer;
    const { asleep, state, waitForState } = useIdleServer(driver.name, (s) => (ts = s));
    /**
     * One sandbox for the file: a fullstack boot is the costly part (under emulation most of all),
     * and the container tests need nothing the services test left behind but a running guest.
     */
    let shared = "";
    const fullstack = async (): Promise<string> =>
      (shared ||= await createSandbox(ts.url, { template: "fullstack", vcpu: 1, memoryMib: 1024 }));
    afterAll(async () => {
      if (shared) await api(ts.url, "DELETE", `/sandboxes/${shared}`);
    });

    async function sh(id: string, cmd: string): Promise<string> {
      const r = await runCommand(ts.wsUrl, id, { cmd });
      expect(r.exit?.exit_code, `${cmd}\n${r.stdout}${r.stderr}`).toBe(0);
      return r.stdout;
    }

    it(
      "starts PostgreSQL and Redis with one command each; data and services survive sleep and wake",
      { timeout: 600_000 },
      async () => {
        const id = await fullstack();
        expect(await sh(id, "bothy-service start postgres")).toBe("postgres: running\n");
        expect(await sh(id, "bothy-service start redis")).toBe("redis: running\n");
        // A small app script using both through their everyday clients and the template's env.
        await sh(
          id,
          [
            "set -e",
            `psql -v ON_ERROR_STOP=1 -q -c "CREATE TABLE notes (body text); INSERT INTO notes VALUES ('kept in postgres')"`,
            `redis-cli -u "$REDIS_URL" SET note "kept in redis"`,
          ].join("\n"),
        );

        expect(await waitForState(id, asleep, IDLE_S + 60)).toBe(asleep);
        // The first command after wake finds both services up and their data in place.
        expect(await sh(id, `psql -tA -c "SELECT body FROM notes"`)).toBe("kept in postgres\n");
        expect(await state(id)).toBe("running");
        expect(await sh(id, `redis-cli -u "$REDIS_URL" GET note`)).toBe("kept in redis\n");
        expect(await sh(id, "bothy-service status")).toBe("postgres: running\nredis: running\n");

        // A stopped service is forgotten: the next wake leaves it stopped.
        await sh(id, "bothy-service stop redis");
        expect(await waitForState(id, asleep, IDLE_S + 60)).toBe(asleep);
        const r = await runCommand(ts.wsUrl, id, { cmd: "bothy-service status" });
        expect(r.stdout).toBe("postgres: running\nredis: stopped\n");
        expect(r.exit?.exit_code).toBe(3);
        expect(await sh(id, `psql -tA -c "SELECT count(*) FROM notes"`)).toBe("1\n");
      },
    );

    // Images come from a tarball or a local build: tests reach no registry.
    const makeImage = [
      "set -e",
      "mkdir -p /tmp/img/bin /tmp/ctx",
      "cp /bin/busybox /tmp/img/bin/",
      "for a in sh echo cat; do ln -sf busybox /tmp/img/bin/$a; done",
      "tar -C /tmp/img -cf /tmp/img.tar .",
      "podman import -q /tmp/img.tar localhost/bb >/dev/null",
      `printf 'FROM localhost/bb\\nRUN echo built > /built\\nCMD ["/bin/sh", "-c", "cat /built"]\\n' > /tmp/ctx/Containerfile`,
      "podman build -q --network=none -t localhost/built /tmp/ctx >/dev/null",
    ].join("\n");

    if (driver.name === "qemu") {
      it(
        "runs containers with podman (and docker) from a tarball and a local build",
        { timeout: 600_000 },
        async () => {
          const id = await fullstack();
          await sh(id, makeImage);
          expect(await sh(id, "podman run --rm --network=none localhost/built")).toBe("built\n");
          expect(await sh(id, "docker run --rm --network=none localhost/bb echo from-docker")).toBe("from-docker\n");
        },
      );
    } else {
      it("refuses containers with a message naming the driver that runs them", { timeout: 300_000 }, async () => {
        const id = await fullstack();
        for (const tool of ["podman", "docker"]) {
          const r = await runCommand(ts.wsUrl, id, { cmd: `${tool} run --rm localhost/bb echo hi` });
          expect(r.exit?.exit_code).toBe(125);
          expect(r.stderr).toContain("use a sandbox on the qemu driver");
        }
      });
    }
  });
}
