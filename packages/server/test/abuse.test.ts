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
      "a fork bomb never runs more than max_processes, is ended by a kill, and the sandbox carries on",
      { timeout: 300_000 },
      async () => {
        expect((await api(ts.url, "GET", `/sandboxes/${abuser}`)).json["max_processes"]).toBe(ABUSER.maxProcesses);
        // The cgroup that holds every command (gVisor: its own pids cgroupfs; a VM: the guest's cgroup2).
        const commands = driver.name === "gvisor" ? "/sys/fs/cgroup/pids/commands" : "/sys/fs/cgroup/commands";
        // A sampler joins that cgroup before the bomb, then reads pids.current with builtins only
        // (it cannot fork at the limit) every 20 ms, printing each new maximum, until the bomb
        // has come and gone. gVisor has no pids.peak; a VM's is read after.
        const sampled: number[] = [];
        let partial = "";
        let samplerReady!: () => void;
        const ready = new Promise<void>((r) => (samplerReady = r));
        const sampler = runCommand(
          ts.wsUrl,
          abuser,
          {
            cmd: [
              "rm -f /tmp/pace; mkfifo /tmp/pace; exec bash -c '",
              "exec 3<>/tmp/pace; m=0; echo ready;",
              `while :; do read c < ${commands}/pids.current;`,
              'if [ "$c" -gt "$m" ]; then m=$c; echo "$m"; fi;',
              'if [ "$m" -ge 16 ] && [ "$c" -le 2 ]; then break; fi;',
              "read -t 0.02 -u 3 x; done'",
            ].join(" "),
            timeout_s: 240,
          },
          {
            keepEvents: false,
            onEvent: (ev) => {
              if (ev.type !== "stdout") return;
              // A line may come in two frames: only whole lines count.
              const lines = (partial + ev.data).split("\n");
              partial = lines.pop() ?? "";
              for (const line of lines)
                if (line === "ready") samplerReady();
                else sampled.push(Number(line));
            },
          },
        );
        await Promise.race([
          ready,
          sampler.then((r) => Promise.reject(new Error(`sampler ended: ${JSON.stringify(r)}`))),
        ]);

        // The bomb runs until the test kills it: no deadline but a backstop timeout. It is at its
        // limit once a fork fails (the shell says so on stderr). `exec`: the shell's own fork of
        // sleep could fail at the limit and end it early with an exit code instead of the kill.
        let bombSocket: WebSocket | undefined;
        let limitHit!: () => void;
        const atLimit = new Promise<"limit">((r) => (limitHit = () => r("limit")));
        const bomb = runCommand(
          ts.wsUrl,
          abuser,
          { cmd: "bomb() { bomb | bomb & }; bomb; exec sleep 600", timeout_s: 240 },
          {
            keepEvents: false,
            onEvent: (ev, ws) => {
              bombSocket = ws;
              if (ev.type === "stderr" && /fork|Resource temporarily unavailable/i.test(ev.data)) limitHit();
            },
          },
        );
        const first = await Promise.race([atLimit, bomb.then(() => "ended" as const)]);
        // The neighbour answers while the abuser sits at its limit.
        const during = first === "limit" ? await roundTrips(3) : [];
        bombSocket?.send(JSON.stringify({ type: "signal", signal: "SIGKILL" }));
        const r = await bomb;
        const s = await sampler;
        console.info(
          `${driver.name} fork bomb: ${first}; pids.current maxima ${sampled.join(",")}; neighbour round trips at the limit ${during.join("/")} ms`,
        );
        // Every sample the sampler got out, however the bomb ended: never above the limit.
        expect(sampled.length).toBeGreaterThan(0);
        expect(Math.max(...sampled)).toBeLessThanOrEqual(ABUSER.maxProcesses);

        if (driver.name === "gvisor" && r.error !== undefined) {
          // README's documented backstop: this runsc leaks a host task per refused fork, and the
          // host's pids limit stopped the whole sandbox before the kill landed. It comes back on
          // the next call, from its disk.
          console.info(`gvisor fork bomb: the host's pids backstop stopped the sandbox (${r.error.message})`);
          expect(r.error.code).toBe("agent_unavailable");
          expect((await api(ts.url, "GET", `/sandboxes/${abuser}`)).json["state"]).toBe("stopped");
        } else {
          expect(first).toBe("limit");
          expect(r.exit).toMatchObject({ type: "process_exited", signal: "SIGKILL" });
          // The sampler saw the bomb come and go, and its largest sample shows it watched it.
          expect(s.exit).toMatchObject({ type: "process_exited", exit_code: 0 });
          expect(Math.max(...sampled)).toBeGreaterThanOrEqual(16);
        }
        if (driver.name === "qemu") {
          // The guest kernel's own record: the highest count ever, and forks it refused.
          const peak = await runCommand(ts.wsUrl, abuser, {
            cmd: `cat ${commands}/pids.max ${commands}/pids.peak; grep max ${commands}/pids.events`,
          });
          const [max, highest, events] = peak.stdout.trim().split("\n");
          expect(max).toBe(String(ABUSER.maxProcesses));
          expect(Number(highest)).toBeLessThanOrEqual(ABUSER.maxProcesses);
          expect(Number(events?.split(" ")[1])).toBeGreaterThan(0);
        }

        // Whatever the bomb left goes with its command: wait until only this check's shell is left.
        const after = await runCommand(ts.wsUrl, abuser, {
          cmd: [
            "for i in $(seq 300); do cat /proc/[0-9]*/comm > /tmp/comm 2>/dev/null;",
            "[ \"$(grep -c '^sh$' /tmp/comm)\" = 1 ] && break; sleep 0.1; done; grep -c '^sh$' /tmp/comm",
          ].join(" "),
        });
        expect(after.stdout.trim()).toBe("1");
        // The limit holds for the next command: a fork past it fails (then the command kills its
        // whole process group, itself included, so no sleep is left behind).
        const capped = await runCommand(ts.wsUrl, abuser, {
          cmd: "( for i in $(seq 100); do sleep 30 & done ) 2>/tmp/forks; grep -c -i -m1 fork /tmp/forks; kill -9 0",
        });
        expect(capped.stdout).toBe("1\n");
        expect((await runCommand(ts.wsUrl, neighbour, { cmd: "cat /workspace/keep" })).stdout).toBe("precious\n");
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
