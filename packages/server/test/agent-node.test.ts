import { describe, expect, it } from "vitest";
import { loadConfig } from "../src/index.ts";
import { runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useServerWithSandbox, useServerWithSandboxNodeExiting } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

/**
 * The Node that runs the agent in gVisor sandboxes (BOTHY_AGENT_NODE): by default the server's
 * own, bind-mounted at /opt/bothy/node, starting from the agent's startup snapshot that Node built
 * at the server's start; where that Node cannot run, bothy-init starts the agent's script on the
 * template's /usr/bin/node instead, and the sandbox works the same.
 */
const gvisor = testDrivers().find((d) => d.name === "gvisor");
const hostNode = loadConfig({ ...process.env, BOTHY_AGENT_NODE: "host" }).gvisor.agentNode;

/** The command line of the sandbox's agent process, as the sandbox's own /proc shows it. */
const AGENT_CMDLINE =
  "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -E '^/[^ ]*node (/opt/bothy/agent.mjs|--snapshot-blob [^ ]*) $'";

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

      it("runs the agent from its startup snapshot, and commands still find the template's node", async () => {
        const r = await runCommand(ts.wsUrl, id, { cmd: `${AGENT_CMDLINE}; node --version` });
        expect(r.exit?.exit_code).toBe(0);
        const [agent, templateNode] = r.stdout.trim().split("\n");
        expect(agent?.trim()).toBe("/opt/bothy/node --snapshot-blob /opt/bothy/agent.blob");
        expect(templateNode).toMatch(/^v\d+\./);
        expect(ts.events.some((e) => e.event === "agent_snapshot")).toBe(true);
      });
    });

    describe("a Node that runs on the host but not in the sandbox", () => {
      let ts: TestServer;
      let id: string;
      useServerWithSandboxNodeExiting(127, (server, sandbox) => {
        ts = server;
        id = sandbox;
      });

      it("falls back to the template's Node, with the agent's script", async () => {
        expect(ts.events.some((e) => e.event === "agent_snapshot")).toBe(true);
        // The fallback agent gets its own spawner helper from bothy-init, as the first would have.
        const r = await runCommand(ts.wsUrl, id, { cmd: `${AGENT_CMDLINE}; cat /proc/$PPID/comm; echo ok` });
        expect(r.exit?.exit_code).toBe(0);
        const [agent, parent, ok] = r.stdout.trim().split("\n");
        expect(agent?.trim()).toBe("/usr/bin/node /opt/bothy/agent.mjs");
        expect(parent).toBe("bothy-helper");
        expect(ok).toBe("ok");
      });
    });
  },
);
