import { stat } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { noLeaks } from "./helpers/host-state.ts";
import { api, createSandbox, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

/**
 * One sandbox misbehaves while a neighbour on the same server keeps working, on every driver: a
 * fork bomb, a memory hog, a disk fill and an output flood. The abuser is small (256 MiB, a
 * 128 MiB disk of its own, at most 64 processes) so each abuse reaches its limit quickly even
 * under emulation. Round trips of the neighbour are printed, not asserted (a shared machine).
 */
const ABUSER = { template: "seed", vcpu: 1, memoryMib: 256, diskMib: 128, maxProcesses: 64 };
const MIB = 1024 * 1024;

for (const driver of testDrivers()) {
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "abuse"), () => {
    let ts: TestServer;
    let neighbour: string;
    let abuser: string;

    beforeAll(async () => {
      ts = await startTestServer({ BOTHY_DRIVER: driver.name });
      // One shape for both: a VM of another shape would cost another warm-start snapshot.
      [neighbour, abuser] = await Promise.all([createSandbox(ts.url, ABUSER), createSandbox(ts.url, ABUSER)]);
      await runCommand(ts.wsUrl, neighbour, { cmd: "echo precious > /workspace/keep" });
    }, 300_000);

    afterAll(async () => {
      for (const id of [neighbour, abuser]) if (id) await api(ts.url, "DELETE", `/sandboxes/${id}`);
      expect(await ts?.stop()).toEqual(noLeaks());
    });

    async function roundTrips(n: number): Promise<number[]> {
      const out: number[] = [];
      for (let i = 0; i < n; i++) {
        const t = performance.now();
        expect((await runCommand(ts.wsUrl, neighbour, { cmd: "cat /workspace/keep" })).stdout).toBe("precious\n");
        out.push(Math.round(performance.now() - t));
      }
      return out;
    }

    /** Runs `cmd` in the abuser while the neighbour answers; prints both round-trip series. */
    async function abuse(name: string, cmd: string, timeoutS: number): Promise<Awaited<ReturnType<typeof runCommand>>> {
      const idle = await roundTrips(3);
      const run = runCommand(ts.wsUrl, abuser, { cmd, timeout_s: timeoutS }, { keepEvents: false });
      await new Promise((r) => setTimeout(r, 500));
      const during = await roundTrips(3);
      const r = await run;
      console.info(
        `${driver.name} ${name}: neighbour round trip idle ${idle.join("/")} ms, during ${during.join("/")} ms`,
      );
      return r;
    }

    it(
      "a fork bomb hits the sandbox's process limit, is ended by its timeout, and the sandbox carries on",
      { timeout: 180_000 },
      async () => {
        expect((await api(ts.url, "GET", `/sandboxes/${abuser}`)).json["max_processes"]).toBe(64);
        // gVisor's short timeout: this runsc leaks a host task for every fork it refuses, its host
        // pids backstop (4096) stops the whole sandbox after ~10 s of refusals, and the agent,
        // starved by the bomb, lands the timeout's kill seconds late. `exec`: the shell's own fork
        // of sleep could fail at the limit and end it early with an exit code instead of the kill.
        const r = await abuse(
          "fork bomb",
          "bomb() { bomb | bomb & }; bomb; exec sleep 60",
          driver.name === "gvisor" ? 2 : 8,
        );
        expect(r.stderr).toMatch(/fork|Resource temporarily unavailable/i);
        expect(r.exit).toMatchObject({ type: "process_exited", signal: "SIGKILL", timed_out: true });
        // Whatever the bomb left is gone with its command (only this check's own shell is left) ...
        const after = await runCommand(ts.wsUrl, abuser, {
          cmd: "sleep 1; cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sh$'",
        });
        expect(after.stdout.trim()).toBe("1");
        // ... and the limit holds for the next command: a fork past it fails (then the command
        // kills its whole process group, itself included, so no sleep is left behind).
        const capped = await runCommand(ts.wsUrl, abuser, {
          cmd: "( for i in $(seq 100); do sleep 30 & done ) 2>/tmp/forks; grep -c -i -m1 fork /tmp/forks; kill -9 0",
        });
        expect(capped.stdout).toBe("1\n");
      },
    );

    it(
      "a memory hog is stopped at the sandbox's memory, with a clear reason; the neighbour carries on",
      { timeout: 180_000 },
      async () => {
        const r = await abuse(
          "memory hog",
          "node -e 'const a = []; for (;;) a.push(Buffer.alloc(16 * 1024 * 1024, 1))'",
          120,
        );
        if (driver.name === "qemu") {
          // The guest's own kernel contains it: its OOM killer ends the hog (never the agent).
          expect(r.exit).toMatchObject({ type: "process_exited", oom_killed: true });
          expect(r.exit?.signal === "SIGKILL" || r.exit?.exit_code === 137).toBe(true);
          expect((await api(ts.url, "GET", `/sandboxes/${abuser}`)).json["state"]).toBe("running");
        } else {
          // Under runsc 2022 the host's memory limit ends the whole sandbox (the sentry is what the
          // host kills): stopped, not lost; the next call starts it again on the same disk.
          expect(r.error).toMatchObject({
            code: "agent_unavailable",
            message: expect.stringMatching(/ran out of memory/),
          });
          expect((await api(ts.url, "GET", `/sandboxes/${abuser}`)).json["state"]).toBe("stopped");
        }
        expect((await runCommand(ts.wsUrl, abuser, { cmd: "echo alive" })).stdout).toBe("alive\n");
      },
    );

    it(
      "filling the disk stops at its disk_mib with ENOSPC, in the sandbox only; the host holds no more than that",
      { timeout: 240_000 },
      async () => {
        expect((await api(ts.url, "GET", `/sandboxes/${abuser}`)).json["disk_mib"]).toBe(128);
        // What the sandbox may still write: about its disk_mib, less the file system's own metadata
        // (a VM's disk also has its image's slack).
        const free = Number(
          (await runCommand(ts.wsUrl, abuser, { cmd: "df -B1 --output=avail / | tail -n 1" })).stdout.trim(),
        );
        expect(free).toBeGreaterThanOrEqual(100 * MIB);
        const r = await abuse(
          "disk fill",
          "dd if=/dev/zero of=/workspace/fill bs=1M count=2000 2>&1; echo dd-exit=$?",
          180,
        );
        expect(r.stdout).toMatch(/No space left on device/);
        expect(r.stdout).not.toContain("dd-exit=0");
        // On the host the sandbox's disk file holds at most what the sandbox could write, plus
        // file system metadata (the files are sparse: blocks count, not length).
        const file = join(ts.home, "sandboxes", abuser, driver.name === "qemu" ? "disk.qcow2" : "disk.ext4");
        const held = (await stat(file)).blocks * 512;
        console.info(
          `${driver.name} disk fill: ${(free / MIB).toFixed(0)} MiB free in the sandbox, host file holds ${(held / MIB).toFixed(0)} MiB`,
        );
        expect(held).toBeLessThanOrEqual(driver.name === "qemu" ? free + 64 * MIB : ABUSER.diskMib * MIB);
        // The sandbox itself carries on: it can free space and write again.
        expect(
          (
            await runCommand(ts.wsUrl, abuser, {
              cmd: "rm /workspace/fill && echo again > /workspace/after && cat /workspace/after",
            })
          ).stdout,
        ).toBe("again\n");
        expect((await runCommand(ts.wsUrl, neighbour, { cmd: "cat /workspace/keep" })).stdout).toBe("precious\n");
      },
    );

    it(
      "a 1 GB output flood is paced, stopped by its timeout, and the server's memory stays flat",
      { timeout: 120_000 },
      async () => {
        const idle = await roundTrips(3);
        // Long enough for the neighbour's round trips to fall inside it (a VM's take seconds under TCG).
        const floodS = driver.name === "qemu" ? 12 : 5;
        const rss = process.memoryUsage().rss;
        let peak = rss;
        const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 50);
        // A client that counts what it gets and keeps none of it: only the server's buffering shows.
        const flood = new Promise<{ bytes: number; exit: unknown }>((resolve, reject) => {
          const ws = new WebSocket(`${ts.wsUrl}/sandboxes/${abuser}/command`);
          let n = 0;
          let last: unknown;
          ws.on("open", () =>
            ws.send(JSON.stringify({ cmd: "head -c 1000000000 /dev/zero | tr '\\0' a", timeout_s: floodS })),
          );
          ws.on("message", (d) => {
            const ev = JSON.parse(d.toString()) as { type: string; data?: string };
            if (ev.type === "stdout") n += ev.data?.length ?? 0;
            else last = ev;
          });
          ws.on("close", () => resolve({ bytes: n, exit: last }));
          ws.on("error", reject);
        });
        await new Promise((r) => setTimeout(r, 500));
        const during = await roundTrips(3);
        const { bytes, exit } = await flood;
        clearInterval(sampler);
        console.info(
          `${driver.name} output flood: neighbour round trip idle ${idle.join("/")} ms, during ${during.join("/")} ms`,
        );
        console.info(
          `${driver.name} output flood: ${(bytes / 1e6).toFixed(0)} MB in ${floodS} s, test process RSS +${((peak - rss) / MIB).toFixed(1)} MB`,
        );
        expect(exit).toMatchObject({ type: "process_exited", signal: "SIGKILL", timed_out: true });
        expect((peak - rss) / MIB).toBeLessThan(100);
        expect((await runCommand(ts.wsUrl, neighbour, { cmd: "cat /workspace/keep" })).stdout).toBe("precious\n");
      },
    );

    it("refuses a disk_mib or max_processes out of range with 400", async () => {
      for (const [body, message] of [
        [{ disk_mib: 10_000_000 }, /disk_mib must be between 64 and \d+/],
        [{ max_processes: 8 }, /max_processes must be between 16 and \d+/],
        [{ max_processes: 10_000_000 }, /max_processes must be between 16 and \d+/],
      ] as const) {
        const r = await api(ts.url, "POST", "/sandboxes", body);
        expect(r.status).toBe(400);
        expect(r.json["detail"]).toMatch(message);
      }
    });
  });
}
