/**
 * bench/screens [--runs R=20]: what a desktop sandbox's screen costs through the API (gVisor,
 * template `desktop`, 1280x800), each against a baseline measured in the same run:
 *  - a screenshot (GET /desktop/screenshot, PNG bytes in hand) against a command round trip of
 *    `true` over the same API (goal: ≤ 150 ms for 1280x800);
 *  - a computer action (a mouse move, then a click) against the same round trip (goal: ≤ 50 ms).
 * Prints medians and p90 and the ratios; no pass/fail.
 */
import { Sandbox } from "@bothy/sdk";
import { startTestServer, type TestServer } from "../packages/server/test/helpers/test-server.ts";
import { header, intArg, median, parseArgs, quantile, stopAndInspect } from "./bench-util.ts";

const usage = "usage: bench/screens [--runs R=20]";
const { flags } = parseArgs(process.argv.slice(2), ["runs"], usage);
const runs = intArg(flags.get("runs"), 20, "--runs", 1, 1000, usage);

async function timed(what: string, fn: () => Promise<unknown>): Promise<number[]> {
  await fn(); // the first call warms the path (the desktop is already started)
  const times: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t = performance.now();
    await fn();
    times.push(performance.now() - t);
  }
  console.log(`${what}: p50 ${median(times).toFixed(1)} ms, p90 ${quantile(times, 0.9).toFixed(1)} ms (${runs} runs)`);
  return times;
}

console.log(await header());
let ts: TestServer | undefined;
try {
  ts = await startTestServer({ BOTHY_DRIVER: "gvisor", BOTHY_POOL_SIZE: "0" });
  const box = await Sandbox.create({ baseUrl: ts.url, template: "desktop", vcpu: 2, memoryMib: 1536 });
  const t = performance.now();
  const info = await box.desktop.start();
  console.log(`desktop start: ${((performance.now() - t) / 1000).toFixed(1)} s, ${info.width}x${info.height}`);
  const floor = median(await timed("command `true` (SDK commands.run)", () => box.commands.run("true")));
  let bytes = 0;
  const shot = median(
    await timed("screenshot", async () => {
      bytes = (await box.desktop.screenshot()).png.length;
    }),
  );
  console.log(`  (a PNG of ${(bytes / 1024).toFixed(0)} KB)`);
  let x = 10;
  const move = median(
    await timed("action: mouse move", () => box.desktop.act({ action: "move", x: (x = (x + 37) % 1200), y: 300 })),
  );
  const click = median(await timed("action: click", () => box.desktop.act({ action: "click", x: 5, y: 5 })));
  console.log(`screenshot: ${shot.toFixed(1)} ms = ${(shot / floor).toFixed(2)}x a command round trip (goal ≤ 150 ms)`);
  console.log(`action (move): ${move.toFixed(1)} ms = ${(move / floor).toFixed(2)}x (goal ≤ 50 ms)`);
  console.log(`action (click): ${click.toFixed(1)} ms = ${(click / floor).toFixed(2)}x (goal ≤ 50 ms)`);
  await box.kill();
} finally {
  if (ts) {
    const { leaks } = await stopAndInspect(ts, "screens");
    console.log(leaks.length === 0 ? "leaks: none" : `leaks:\n  ${leaks.join("\n  ")}`);
  }
}
