/**
 * bench/auth [N=20] [--rtt R=50] [--driver gvisor|qemu]: what API keys cost. Two servers side by
 * side, one with keys (BOTHY_AUTH=keys, the default) and one without (BOTHY_AUTH=none, loopback
 * only); runs alternate between them so load changes hit both alike. Prints the medians of the
 * create → `echo ok` → delete loop and of a command round trip (`true` over the WebSocket), and
 * the ratio keys/none (goal: at most 1.05). Exits 1 on a failed run or a leak.
 */
import { createSandbox, runCommand } from "../packages/server/test/helpers/client.ts";
import { startTestServer, type TestServer } from "../packages/server/test/helpers/test-server.ts";
import { header, intArg, median, parseArgs, secs, seedTemplate, stopAndInspect, timedRun } from "./bench-util.ts";

const usage = "usage: bench/auth [N=20] [--rtt R=50] [--driver gvisor|qemu]";
const { flags, positional } = parseArgs(process.argv.slice(2), ["rtt", "driver"], usage);
const runs = intArg(positional[0], 20, "N", 1, 10_000, usage);
const rtts = intArg(flags.get("rtt"), 50, "--rtt", 1, 100_000, usage);
const driver = flags.get("driver") ?? process.env["BOTHY_DRIVER"] ?? "gvisor";

console.log(await header());
await seedTemplate();
console.log(`# auth: ${runs} loop runs and ${rtts} round trips per mode, driver ${driver}`);

const modes = ["keys", "none"] as const;
const servers = new Map<(typeof modes)[number], TestServer>();
const loop = { keys: [] as number[], none: [] as number[] };
const rtt = { keys: [] as number[], none: [] as number[] };
const problems: string[] = [];
try {
  for (const mode of modes) servers.set(mode, await startTestServer({ BOTHY_DRIVER: driver, BOTHY_AUTH: mode }));
  const each = async (i: number, step: (mode: (typeof modes)[number], ts: TestServer) => Promise<void>) => {
    // Alternate which mode goes first.
    for (const mode of i % 2 === 0 ? modes : [...modes].reverse()) {
      const ts = servers.get(mode);
      if (ts) await step(mode, ts);
    }
  };
  for (let i = 0; i < runs; i++)
    await each(i, async (mode, ts) => {
      loop[mode].push((await timedRun(ts.url, ts.wsUrl)).total);
    });
  const sandboxes = new Map<string, string>();
  for (const [mode, ts] of servers) {
    const id = await createSandbox(ts.url);
    sandboxes.set(mode, id);
    await runCommand(ts.wsUrl, id, { cmd: "true" });
  }
  for (let i = 0; i < rtts; i++)
    await each(i, async (mode, ts) => {
      const t = performance.now();
      const r = await runCommand(ts.wsUrl, sandboxes.get(mode) ?? "", { cmd: "true" }, { keepEvents: false });
      rtt[mode].push(performance.now() - t);
      if (r.exit?.exit_code !== 0) throw new Error(`${mode}: true gave ${JSON.stringify(r.exit ?? r.error)}`);
    });
} catch (err) {
  problems.push(`run: ${(err as Error).message}`);
} finally {
  for (const [mode, ts] of servers) {
    const found = await stopAndInspect(ts, `bench-auth-${mode}`, problems.length > 0);
    problems.push(...found.leaks.map((l) => `leak (${mode}): ${l}`));
  }
}

const ratio = (a: number[], b: number[]): string => (median(a) / median(b)).toFixed(3);
if (loop.keys.length > 0 && loop.none.length > 0)
  console.log(
    `create → echo → delete, median: keys ${secs(median(loop.keys))}, none ${secs(median(loop.none))}, ratio ${ratio(loop.keys, loop.none)} (goal <= 1.05)`,
  );
if (rtt.keys.length > 0 && rtt.none.length > 0)
  console.log(
    `command round trip, median: keys ${median(rtt.keys).toFixed(1)} ms, none ${median(rtt.none).toFixed(1)} ms, ratio ${ratio(rtt.keys, rtt.none)} (goal <= 1.05)`,
  );
for (const p of problems) console.log(p);
process.exit(problems.length > 0 ? 1 : 0);
