/**
 * bench/screens [--runs R=20]: what a desktop sandbox's screen costs through the API (gVisor,
 * template `desktop`, 1280x800), each against a baseline measured in the same run:
 *  - a screenshot (GET /desktop/screenshot, PNG bytes in hand) against a command round trip of
 *    `true` over the same API (goal: ≤ 150 ms for 1280x800);
 *  - a computer action (a mouse move, then a click) against the same round trip (goal: ≤ 50 ms).
 * Then where an action's time goes, inside the sandbox: the same input lines sent straight to the
 * desktop helper's port by a Node client in the sandbox (no API, no channel), with Chromium running
 * and again after it is stopped (the X server then serves the input alone), and the same two
 * actions through the API without Chromium. Prints medians and p90 and the ratios; no pass/fail.
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

/**
 * Medians (ms) of each input line set sent to the desktop helper's port from inside the sandbox, one
 * connection per request as the server makes them (desktop-main.ts's protocol). `nothing` is the
 * helper's own floor: a connection and xdotool's `getmouselocation`, which every action ends with.
 */
const IN_SANDBOX_PROBE = `
const net = require("net");
const sets = { nothing: [], move: ["mousemove 100 300"], click: ["mousemove 5 5", "click --repeat 1 --delay 0 1"] };
function once(lines) {
  return new Promise((resolve, reject) => {
    const t = performance.now();
    const s = net.connect(5910, "127.0.0.1", () => s.write(JSON.stringify({ do: "input", lines }) + "\\n"));
    s.on("error", reject);
    s.resume();
    s.on("end", () => resolve(performance.now() - t));
  });
}
(async () => {
  const out = {};
  for (const [name, lines] of Object.entries(sets)) {
    const times = [];
    for (let i = 0; i <= RUNS; i++) times.push(await once(lines));
    times.shift();
    times.sort((a, b) => a - b);
    out[name] = times[Math.floor(times.length / 2)];
  }
  console.log(JSON.stringify(out));
})();
`;

async function actionSplit(box: Sandbox): Promise<void> {
  const probe = async (): Promise<Record<string, number>> => {
    await box.files.write("/tmp/bench-probe.cjs", IN_SANDBOX_PROBE.replace("RUNS", String(runs)));
    const r = await box.commands.run("node /tmp/bench-probe.cjs", { timeoutS: 300 });
    return JSON.parse(r.stdout) as Record<string, number>;
  };
  const show = (m: Record<string, number>): string =>
    Object.entries(m)
      .map(([k, v]) => `${k} ${v.toFixed(1)} ms`)
      .join(", ");
  console.log(`in the sandbox, straight to the helper (medians): ${show(await probe())}`);
  // [c]: the pattern does not match pkill's own shell, whose command line holds it.
  await box.commands.run("pkill -f '[c]hromium'; while pgrep -f '[c]hromium' >/dev/null; do sleep 0.1; done", {
    timeoutS: 30,
  });
  console.log(`same, Chromium stopped: ${show(await probe())}`);
  const move = median(
    await timed("  through the API, Chromium stopped: mouse move", () =>
      box.desktop.act({ action: "move", x: 100, y: 300 }),
    ),
  );
  const click = median(
    await timed("  through the API, Chromium stopped: click", () => box.desktop.act({ action: "click", x: 5, y: 5 })),
  );
  console.log(`action without Chromium: move ${move.toFixed(1)} ms, click ${click.toFixed(1)} ms (goal ≤ 50 ms)`);
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
  await actionSplit(box);
  await box.kill();
} finally {
  if (ts) {
    const { leaks } = await stopAndInspect(ts, "screens");
    console.log(leaks.length === 0 ? "leaks: none" : `leaks:\n  ${leaks.join("\n  ")}`);
  }
}
