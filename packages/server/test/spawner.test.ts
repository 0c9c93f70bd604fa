import { describe, expect, it } from "vitest";
import { runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useServerWithSandbox } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

/**
 * The guest's command spawner (bothy-helper spawner, delivered with the agent on both drivers):
 * from the first command after a create, commands are its children, in the process-limited
 * cgroup, without the agent's OOM-killer exemption, in a session of their own.
 */
for (const driver of testDrivers()) {
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "command spawner"), () => {
    let ts: TestServer;
    let id: string;

    useServerWithSandbox(driver.name, (server, sandbox) => {
      ts = server;
      id = sandbox;
    });

    it("starts the first command from the helper, in the commands' cgroup and a session of its own", async () => {
      const r = await runCommand(ts.wsUrl, id, {
        cmd: 'cat /proc/$PPID/comm; grep -c commands /proc/self/cgroup; cat /proc/self/oom_score_adj; cut -d" " -f6 /proc/$$/stat; echo $$',
      });
      expect(r.exit?.exit_code).toBe(0);
      const [parent, inCgroup, oomAdj, sid, pid] = r.stdout.trim().split("\n");
      expect(parent).toBe("bothy-helper");
      expect(Number(inCgroup)).toBeGreaterThanOrEqual(1);
      expect(oomAdj).toBe("0");
      expect(sid).toBe(pid);
    });

    it.skipIf(driver.name !== "gvisor")(
      "in gVisor runs beside the agent, started by bothy-init, and hands commands nothing of it",
      async () => {
        const r = await runCommand(ts.wsUrl, id, {
          cmd: 'cut -d" " -f4 /proc/$PPID/stat; env | grep -c ^BOTHY_; ls /proc/self/fd | wc -l; ls /run/bothy',
        });
        expect(r.exit?.exit_code).toBe(0);
        const [helperParent, bothyVariables, fds, ...sockets] = r.stdout.trim().split("\n");
        expect(helperParent).toBe("1");
        // BOTHY_SANDBOX_ID is the one the sandbox's spec gives every process.
        expect(bothyVariables).toBe("1");
        // stdin, stdout, stderr, and the directory `ls` reads.
        expect(fds).toBe("4");
        // The control socket is gone once the agent has connected.
        expect(sockets).toEqual(["spawner.sock"]);
      },
    );

    it("keeps exit codes, signals, stdin and output apart", async () => {
      const r = await runCommand(ts.wsUrl, id, { cmd: "echo out; echo err >&2; exit 7" });
      expect([r.stdout, r.stderr, r.exit?.exit_code]).toEqual(["out\n", "err\n", 7]);
      const killed = await runCommand(ts.wsUrl, id, { cmd: "kill -TERM $$" });
      expect(killed.exit?.signal).toBe("SIGTERM");
      const echoed = await runCommand(
        ts.wsUrl,
        id,
        { cmd: "tr a-z A-Z", stdin: true },
        {
          onEvent: (ev, ws) => {
            if (ev.type === "started") {
              ws.send(JSON.stringify({ type: "stdin", data: "piped" }));
              ws.send(JSON.stringify({ type: "stdin_eof" }));
            }
          },
        },
      );
      expect(echoed.stdout).toBe("PIPED");
    });
  });
}
