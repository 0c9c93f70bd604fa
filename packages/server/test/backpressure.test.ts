import { readFileSync } from "node:fs";
import { OUTPUT_WINDOW_BYTES } from "@bothy/protocol";
import { describe, expect, it } from "vitest";
import WebSocket from "ws";
import { startBackgroundCommand } from "./helpers/background.ts";
import { api, pollUntil, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useServerWithSandbox } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

const SINK_SERVER = readFileSync(new URL("./fixtures/sink-server.mjs", import.meta.url));
const SINK_TCP = 7400;
const SINK_WS = 7401;
/** What a client pushes at a port that never reads: far beyond every buffer on the way. */
const PUSHED = 64 * 1024 * 1024;
/** The most the host may hold for one relay: a 2 MiB message the WebSocket had half read, the stream's buffer, slack. */
const HELD_BOUND = 4 * 1024 * 1024;

/** One series of the server's /metrics. */
async function metric(url: string, series: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  if (line === undefined) throw new Error(`no ${series} in /metrics`);
  return Number(line.slice(series.length + 1));
}

for (const driver of testDrivers()) {
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "backpressure"), () => {
    let ts: TestServer;
    let id: string;

    useServerWithSandbox(driver.name, (server, sandbox) => {
      ts = server;
      id = sandbox;
    });

    // Software-emulated QEMU moves ~0.3 MB/s of output on this host: its smaller flood, four times
    // the agent's credit window (OUTPUT_WINDOW_BYTES), still checks pacing end to end through a
    // paused client; the memory bound is what the gVisor run's 100 MB shows.
    const TOTAL = driver.name === "qemu" ? 4 * OUTPUT_WINDOW_BYTES : 100_000_000;

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

    // The relays are the host's code, the same for every driver: they are checked once, on the
    // faster driver (QEMU's emulated Node takes a minute to start the sink).
    describe("a port inside that accepts and never reads", () => {
      /** Starts the sink on `tcp` and `ws` inside; answers how to stop it. */
      async function startSink(tcp: number, wsPort: number): Promise<() => Promise<void>> {
        const put = await fetch(`${ts.url}/sandboxes/${id}/files?path=/workspace/sink-server.mjs`, {
          method: "PUT",
          body: SINK_SERVER,
          headers: { "content-type": "application/octet-stream" },
        });
        expect(put.status).toBe(200);
        const pidFile = `/tmp/sink-${tcp}.pid`;
        await startBackgroundCommand(
          ts.url,
          id,
          `echo $$ > ${pidFile}; exec node /workspace/sink-server.mjs ${tcp} ${wsPort} > /tmp/sink-${tcp}.log 2>&1`,
        );
        // Node starts in seconds under QEMU's emulation here.
        await pollUntil(
          "the sink's ports",
          async () => {
            const ports = (await api(ts.url, "GET", `/sandboxes/${id}/ports`)).json["ports"] as Array<{ port: number }>;
            return [tcp, wsPort].every((p) => ports.some((l) => l.port === p));
          },
          120_000,
        ).catch(async (err: unknown) => {
          const log = await runCommand(ts.wsUrl, id, { cmd: `cat /tmp/sink-${tcp}.log` });
          throw new Error(`${(err as Error).message}; the sink said: ${log.stdout}`);
        });
        return async () => {
          expect((await runCommand(ts.wsUrl, id, { cmd: `kill $(cat ${pidFile})` })).exit).toMatchObject({
            exit_code: 0,
          });
        };
      }

      /**
       * Pushes PUSHED bytes in 1 MiB messages through a WebSocket relay until the server reports
       * the relay paused; answers what the host holds for it and what the client could not send.
       * The client then leaves and the sink is stopped: a paused relay ends with the sandbox's side.
       */
      async function push(url: string, stopSink: () => Promise<void>): Promise<{ held: number; unsent: number }> {
        const ws = new WebSocket(url);
        await new Promise<void>((resolve, reject) => ws.once("open", resolve).once("error", reject));
        try {
          const mib = Buffer.alloc(1024 * 1024, 0x61);
          for (let sent = 0; sent < PUSHED; sent += mib.length) ws.send(mib);
          await pollUntil(
            "the relay to pause its client",
            async () => (await metric(ts.url, 'bothy_relays{state="paused"}')) === 1,
            60_000,
          );
          const held = await metric(ts.url, "bothy_relay_held_bytes");
          console.info(
            `${driver.name}: ${url.split("/").slice(-3).join("/")}: host holds ${held} bytes, client kept ${ws.bufferedAmount} of ${PUSHED}`,
          );
          return { held, unsent: ws.bufferedAmount };
        } finally {
          ws.terminate();
          await stopSink();
          await pollUntil("the relay to end", async () => {
            const open =
              (await metric(ts.url, 'bothy_relays{state="paused"}')) +
              (await metric(ts.url, 'bothy_relays{state="flowing"}'));
            return open === 0;
          });
        }
      }

      it.skipIf(driver.name !== "gvisor")(
        "a client pushing through the TCP tunnel is paused: the host holds a bounded amount",
        async () => {
          const stop = await startSink(SINK_TCP, SINK_WS);
          const { held, unsent } = await push(`${ts.wsUrl}/sandboxes/${id}/tunnel/${SINK_TCP}`, stop);
          expect(held).toBeLessThan(HELD_BOUND);
          // The rest waits in the client: the relay stopped reading it.
          expect(unsent).toBeGreaterThan(PUSHED / 2);
        },
      );

      it.skipIf(driver.name !== "gvisor")(
        "a client pushing through a port's WebSocket is paused: the host holds a bounded amount",
        async () => {
          const stop = await startSink(SINK_TCP + 10, SINK_WS + 10);
          const { held, unsent } = await push(`${ts.wsUrl}/sandboxes/${id}/ports/${SINK_WS + 10}/`, stop);
          expect(held).toBeLessThan(HELD_BOUND);
          expect(unsent).toBeGreaterThan(PUSHED / 2);
        },
      );
    });
  });
}
