import { describe, expect, it } from "vitest";
import WebSocket from "ws";
import { runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useServerWithSandbox } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

for (const driver of testDrivers()) {
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "backpressure"), () => {
    let ts: TestServer;
    let id: string;

    useServerWithSandbox(driver.name, (server, sandbox) => {
      ts = server;
      id = sandbox;
    });

    // Software-emulated QEMU moves ~0.3 MB/s of output on this host: its smaller flood still
    // outlasts the credit window by far and checks pacing end to end through a paused client; the
    // memory bound is what the gVisor run's 100 MB shows.
    const TOTAL = driver.name === "qemu" ? 12_000_000 : 100_000_000;

    /** The agent's resident memory, sampled for a while (gVisor has no VmHWM). */
    async function agentRssKb(seconds: number): Promise<number[]> {
      // The agent is the node process running agent.mjs, or its snapshot (under gVisor, PID 1 is bothy-init).
      const find = `for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -qE '^[^ ]*node ([^ ]*agent.mjs|--snapshot-blob)' && s=$p/status; done`;
      const r = await runCommand(ts.wsUrl, id, {
        cmd: `${find}; for i in $(seq 1 ${seconds * 10}); do grep VmRSS $s; sleep 0.1; done`,
      });
      expect(r.stdout).toContain("VmRSS");
      return [...r.stdout.matchAll(/(\d+) kB/g)].map((m) => Number(m[1]));
    }

    describe("a command flooding its output", () => {
      it("is paced by a slow client: memory stays flat in the agent, the server and the client (100 MB on gVisor)", async () => {
        const agentBefore = Math.max(...(await agentRssKb(0.3)));
        const agentDuring = agentRssKb(6);
        const rssBefore = process.memoryUsage().rss;
        let peak = rssBefore;
        const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 20);

        let received = 0;
        let exit: unknown;
        await new Promise<void>((resolve, reject) => {
          const ws = new WebSocket(`${ts.wsUrl}/sandboxes/${id}/command`);
          ws.on("open", () => {
            ws.send(JSON.stringify({ cmd: `head -c ${TOTAL} /dev/zero | tr '\\0' a` }));
            // Stop reading for a while: the server must stop pulling from the guest, not buffer.
            const raw = (ws as unknown as { _socket: { pause(): void; resume(): void } })._socket;
            setTimeout(() => raw.pause(), 200);
            setTimeout(() => raw.resume(), 2200);
          });
          ws.on("message", (data) => {
            const ev = JSON.parse(data.toString()) as { type: string; data?: string };
            if (ev.type === "stdout") received += ev.data?.length ?? 0;
            if (ev.type === "process_exited") exit = ev;
          });
          ws.on("close", () => resolve());
          ws.on("error", reject);
        });
        clearInterval(sampler);

        expect(exit).toMatchObject({ exit_code: 0 });
        expect(received).toBe(TOTAL);
        const growthMb = (peak - rssBefore) / 1024 / 1024;
        expect(growthMb).toBeLessThan(60); // server and client together, while 100 MB passed through
        const agentGrowthKb = Math.max(...(await agentDuring)) - agentBefore;
        console.info(
          `${driver.name}: ${TOTAL / 1e6} MB streamed: test process RSS +${growthMb.toFixed(1)} MB, agent RSS +${(agentGrowthKb / 1024).toFixed(1)} MB`,
        );
        // Garbage not yet collected accounts for some growth; a buffered stream would be ~100 MB.
        expect(agentGrowthKb).toBeLessThan(60 * 1024);
      });
    });
  });
}
