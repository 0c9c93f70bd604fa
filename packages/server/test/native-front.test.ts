import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { api, runCommand } from "./helpers/client.ts";
import { driverTitle, testDriver } from "./helpers/drivers.ts";
import { useServerWithSandbox, useServerWithSandboxNodeExiting } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

const pexec = promisify(execFile);

/**
 * bothy-init's native front (packages/guest/native/front.c): in a gVisor sandbox PID 1 answers the
 * host's hello and `limits` itself, so a sandbox is handed out with no Node running; the agent and
 * its spawner start with the first frame that needs them. Seen from the host with `runsc ps`, which
 * lists the container's processes without starting anything inside it.
 */
const gvisor = testDriver("gvisor");

/** The command names of the sandbox's processes, as `runsc ps` on the server's runsc root shows them. */
async function sandboxProcesses(ts: TestServer): Promise<string[]> {
  const root = join(ts.home, "runsc");
  const runsc = process.env["BOTHY_RUNSC"] || "runsc";
  const { stdout: list } = await pexec(runsc, ["--root", root, "list", "-quiet"]);
  const [container, ...others] = list.split("\n").filter(Boolean);
  if (container === undefined || others.length > 0) throw new Error(`expected one container, runsc list says: ${list}`);
  const { stdout } = await pexec(runsc, ["--root", root, "ps", container]);
  // UID PID PPID C STIME TIME CMD: the last column, one row per process.
  return stdout
    .trim()
    .split("\n")
    .slice(1)
    .map((row) => row.trim().split(/\s+/).at(-1) ?? "")
    .sort();
}

/** The front is opt-in until exec is native (config.ts BOTHY_AGENT_START). */
const LAZY = { BOTHY_AGENT_START: "lazy" };

describe.skipIf(gvisor.missing !== undefined)(driverTitle(gvisor, "the native front"), () => {
  describe("a sandbox with the host's Node", () => {
    let ts: TestServer;
    let id: string;
    useServerWithSandbox(
      "gvisor",
      (server, sandbox) => {
        ts = server;
        id = sandbox;
      },
      LAZY,
    );

    it("is handed out with only PID 1 running; the first command starts the agent and its spawner beside it", async () => {
      expect(await sandboxProcesses(ts)).toEqual(["bothy-init"]);
      const r = await runCommand(ts.wsUrl, id, {
        cmd: 'cat /proc/1/comm /proc/$PPID/comm; for p in /proc/[0-9]*; do [ "$(cat $p/comm)" = node ] && cut -d" " -f4 $p/stat; done; echo ok',
      });
      expect(r.exit?.exit_code).toBe(0);
      // PID 1 is still bothy-init, the command's parent the spawner, and the agent PID 1's child.
      expect(r.stdout.trim().split("\n")).toEqual(["bothy-init", "bothy-helper", "1", "ok"]);
      expect(await sandboxProcesses(ts)).toEqual(["bothy-helper", "bothy-init", "node"]);
      // Commands go on as before once it is up: output, exit codes, stdin.
      const echoed = await runCommand(
        ts.wsUrl,
        id,
        { cmd: "tr a-z A-Z; exit 3", stdin: true },
        {
          onEvent: (ev, ws) => {
            if (ev.type !== "started") return;
            ws.send(JSON.stringify({ type: "stdin", data: "front" }));
            ws.send(JSON.stringify({ type: "stdin_eof" }));
          },
        },
      );
      expect([echoed.stdout, echoed.exit?.exit_code]).toEqual(["FRONT", 3]);
    });
  });

  describe("an agent that cannot start", () => {
    let ts: TestServer;
    let id: string;
    // A Node that fails at once in the sandbox with a status that has no fallback (only 127 has one).
    useServerWithSandboxNodeExiting(
      3,
      (server, sandbox) => {
        ts = server;
        id = sandbox;
      },
      LAZY,
    );

    it("still starts the sandbox, and answers each request that needs the agent with an error, never a hang", async () => {
      // The create was answered by the front alone.
      expect((await api(ts.url, "GET", `/sandboxes/${id}`)).json["state"]).toBe("running");
      for (let attempt = 0; attempt < 2; attempt++) {
        const r = await runCommand(ts.wsUrl, id, { cmd: "echo never" });
        expect(r.stdout).toBe("");
        expect(r.error?.code).toBe("invalid_command");
        expect(r.error?.message).toContain("guest agent exited while starting (status 3)");
      }
      const read = await api(ts.url, "GET", `/sandboxes/${id}/files/stat?path=/etc/hostname`);
      expect(read.status).toBeGreaterThanOrEqual(400);
      expect(JSON.stringify(read.json)).toContain("guest agent exited while starting");
      expect(await sandboxProcesses(ts)).toEqual(["bothy-init"]);
    });
  });
});
