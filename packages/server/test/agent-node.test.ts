import { chmod, mkdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadConfig } from "../src/index.ts";
import { runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useServerWithSandbox } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

/**
 * The Node that runs the agent in gVisor sandboxes (BOTHY_AGENT_NODE): by default the server's
 * own, bind-mounted at /opt/bothy/node; where that cannot run, bothy-init starts the agent on the
 * template's /usr/bin/node instead, and the sandbox works the same.
 */
const gvisor = testDrivers().find((d) => d.name === "gvisor");
const hostNode = loadConfig({ ...process.env, BOTHY_AGENT_NODE: "host" }).gvisor.agentNode;

/** The command line of the sandbox's agent process, as the sandbox's own /proc shows it. */
const AGENT_CMDLINE =
  "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -E '^/[^ ]*node /opt/bothy/agent.mjs $'";

describe.skipIf(!gvisor || gvisor.missing !== undefined)(
  driverTitle(gvisor ?? { name: "gvisor", missing: "gvisor" }, "the agent's Node"),
  () => {
    describe.skipIf(hostNode === undefined)("the host's Node (default)", () => {
      let ts: TestServer;
      let id: string;
      useServerWithSandbox("gvisor", (server, sandbox) => {
        ts = server;
        id = sandbox;
      });

      it("runs the agent, and commands still find the template's node", async () => {
        const r = await runCommand(ts.wsUrl, id, { cmd: `${AGENT_CMDLINE}; node --version` });
        expect(r.exit?.exit_code).toBe(0);
        const [agent, templateNode] = r.stdout.trim().split("\n");
        expect(agent?.trim()).toBe("/opt/bothy/node /opt/bothy/agent.mjs");
        expect(templateNode).toMatch(/^v\d+\./);
      });
    });

    describe("a Node that cannot run in the sandbox", () => {
      const dir = join(tmpdir(), `bothy-agent-node-${process.pid}`);
      let ts: TestServer;
      let id: string;
      beforeAll(async () => {
        await mkdir(dir, { recursive: true });
        // exec of it fails in the sandbox (no such interpreter), as a loader refusing its libraries would.
        await writeFile(join(dir, "node"), "#!/no/such/interpreter\n");
        await chmod(join(dir, "node"), 0o755);
      });
      afterAll(async () => {
        await rm(dir, { recursive: true, force: true });
      });
      useServerWithSandbox(
        "gvisor",
        (server, sandbox) => {
          ts = server;
          id = sandbox;
        },
        { BOTHY_AGENT_NODE: join(dir, "node") },
      );

      it("falls back to the template's Node", async () => {
        const r = await runCommand(ts.wsUrl, id, { cmd: `${AGENT_CMDLINE}; echo ok` });
        expect(r.exit?.exit_code).toBe(0);
        const [agent, ok] = r.stdout.trim().split("\n");
        expect(agent?.trim()).toBe("/usr/bin/node /opt/bothy/agent.mjs");
        expect(ok).toBe("ok");
      });
    });
  },
);
