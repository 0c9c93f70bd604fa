/**
 * bench/dashboard [--sandboxes N=200] [--runs R=5]: the dashboard's sandbox list with N sandboxes,
 * in the host's Chromium against a real server. The sandboxes are rows inserted into the ledger
 * (gVisor, asleep: `stopped`), not booted ones: the list's cost is the page's and the API's, and
 * N real sandboxes would not fit this machine. Prints:
 *  - first render: from the navigation's start to N rows on the screen, median of R loads
 *    (goal: under 1 s), and where it went: until GET /sandboxes is sent (the page and the
 *    session), its answer, and the page's own work after it;
 *  - live: from a sandbox.created event (its row inserted, the event published as the manager
 *    does) to its row on the screen, and from sandbox.deleted to the row gone, medians of R;
 *  - the UI's own JavaScript gzipped (bench/ui-size.ts; goal under 150 KB).
 * No pass/fail. Run `npm run build` first.
 */
import { randomBytes } from "node:crypto";
import { chromium } from "playwright-core";
import { insertTestSandbox } from "../packages/server/test/helpers/ledger-rows.ts";
import { API_HOST, CHROMIUM, signIn } from "../packages/server/test/helpers/dashboard-browser.ts";
import { startTestServer, type TestServer } from "../packages/server/test/helpers/test-server.ts";
import { header, intArg, median, parseArgs } from "./bench-util.ts";

const usage = "usage: bench/dashboard [--sandboxes N=200] [--runs R=5]";
const { flags } = parseArgs(process.argv.slice(2), ["sandboxes", "runs"], usage);
const count = intArg(flags.get("sandboxes"), 200, "--sandboxes", 1, 5000, usage);
const runs = intArg(flags.get("runs"), 5, "--runs", 1, 100, usage);

const B32 = "abcdefghijklmnopqrstuvwxyz234567";
const sandboxId = (): string => `sbx_${[...randomBytes(20)].map((b) => B32[b % 32]).join("")}`;

/** A row as a sleeping gVisor sandbox of the default tenant has it, with some metadata to filter on. */
async function addRow(ts: TestServer, i: number): Promise<string> {
  const id = sandboxId();
  await insertTestSandbox(ts.server.ledger, {
    id,
    driver: "gvisor",
    metadata: JSON.stringify({ team: `team-${i % 7}`, run: String(i) }),
  });
  // A row starts running; it sleeps as an idle gVisor sandbox does.
  await ts.server.ledger.transition(id, "running", "stopped");
  return id;
}

console.log(await header());
let ts: TestServer | undefined;
const browser = await chromium.launch({
  executablePath: CHROMIUM,
  args: ["--no-sandbox", "--disable-gpu", `--host-resolver-rules=MAP ${API_HOST} 127.0.0.1`],
});
try {
  // No sweeps while it runs: the rows have no sandbox behind them.
  ts = await startTestServer({ BOTHY_SWEEP_INTERVAL_S: "3600" });
  const ui = `http://${API_HOST}:${new URL(ts.url).port}`;
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await signIn(page, ui, ts.apiKey);

  /** A load's figures, ms from the navigation's start: GET /sandboxes sent and answered, and `ready` shown. */
  interface Load {
    asked: number;
    answered: number;
    shown: number;
  }
  /** Read in the page: the list request's resource timing and the time now. */
  const TIMES = `(() => {
    const list = performance.getEntriesByType("resource").find((e) => new URL(e.name).pathname === "/sandboxes");
    return { asked: list ? list.requestStart : NaN, answered: list ? list.responseEnd : NaN, shown: performance.now() };
  })()`;
  /** Medians of `runs` loads until `ready` (a selector) shows. */
  const load = async (ready: string): Promise<Load> => {
    const loads: Load[] = [];
    for (let r = 0; r < runs + 1; r++) {
      // From a blank page: a second goto to the same address would only change its hash, not load it.
      await page.goto("about:blank");
      await page.goto(`${ui}/ui/#/sandboxes`);
      await page.locator(ready).waitFor();
      const times = await page.evaluate<Load>(TIMES);
      if (r > 0) loads.push(times); // the first load fills the browser's cache, as a returning person's would be
    }
    return {
      asked: median(loads.map((l) => l.asked)),
      answered: median(loads.map((l) => l.answered)),
      shown: median(loads.map((l) => l.shown)),
    };
  };
  /** Where a load's time went: before the list was asked for, the API's answer, the page's own work after it. */
  const parts = (l: Load): string =>
    `list asked at ${l.asked.toFixed(0)} ms, answered ${(l.answered - l.asked).toFixed(0)} ms later, shown ${(l.shown - l.answered).toFixed(0)} ms after that`;
  // The baseline in the same run: the same page with an empty list (load moves absolute figures a lot here).
  const empty = await load("p.empty");
  console.log(`first render of an empty list: median ${empty.shown.toFixed(0)} ms (${runs} loads; ${parts(empty)})`);
  for (let i = 0; i < count; i++) await addRow(ts, i);
  const first = await load(`tr[data-sandbox] >> nth=${count - 1}`);
  console.log(
    `first render of ${count} sandboxes: median ${first.shown.toFixed(0)} ms = ${(first.shown / empty.shown).toFixed(2)}x the empty list (goal < 1000 ms; ${parts(first)})`,
  );

  const appear: number[] = [];
  const vanish: number[] = [];
  for (let r = 0; r < runs; r++) {
    const t0 = performance.now();
    const id = await addRow(ts, count + r);
    await ts.server.events.publish("sandbox.created", id, {}, "default");
    await page.locator(`tr[data-sandbox="${id}"]`).waitFor();
    appear.push(performance.now() - t0);
    const t1 = performance.now();
    await ts.server.ledger.transition(id, "stopped", "deleting");
    await ts.server.ledger.transition(id, "deleting", "deleted");
    await ts.server.events.publish("sandbox.deleted", id, {}, "default");
    await page.locator(`tr[data-sandbox="${id}"]`).waitFor({ state: "detached" });
    vanish.push(performance.now() - t1);
  }
  console.log(`live with ${count} listed: a created sandbox's row shows in median ${median(appear).toFixed(0)} ms`);
  console.log(`live with ${count} listed: a deleted sandbox's row goes in median ${median(vanish).toFixed(0)} ms`);
} finally {
  await browser.close();
  if (ts) {
    const leaks = await ts.stop();
    const left = Object.entries(leaks).filter(([, v]) => Array.isArray(v) && v.length > 0);
    console.log(left.length === 0 ? "leaks: none" : `leaks: ${JSON.stringify(Object.fromEntries(left))}`);
  }
}
await import("./ui-size.ts");
