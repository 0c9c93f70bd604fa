/**
 * bench/loop [N=100] [--pool K] [--driver gvisor|qemu]: N sequential create → `echo ok` → delete runs against a fresh
 * server, then a look at the host for anything the server left behind. Prints figures; exits 1
 * on a failed run or a leak.
 */
import { startTestServer, type TestServer } from "../packages/server/test/helpers/test-server.ts";
import {
  header,
  intArg,
  interruptSignal,
  mean,
  median,
  parseArgs,
  secs,
  seedTemplate,
  stopAndInspect,
  summary,
  timedRun,
  type Creates,
  type RunTimes,
} from "./bench-util.ts";

/** Stop early rather than hammer a server that has plainly broken. */
const MAX_CONSECUTIVE_FAILURES = 10;

const usage =
  "usage: bench/loop [N=100] [--pool K (default $BOTHY_POOL_SIZE, else 1)] [--driver gvisor|qemu (default $BOTHY_DRIVER, else auto)]";
const { flags, positional } = parseArgs(process.argv.slice(2), ["pool", "driver"], usage);
const runs = intArg(positional[0], 100, "N", 1, 100_000, usage);
const pool = intArg(flags.get("pool") ?? process.env["BOTHY_POOL_SIZE"], 1, "--pool", 0, 32, usage);
const driver = flags.get("driver") ?? process.env["BOTHY_DRIVER"] ?? "auto";
if (!["auto", "gvisor", "qemu"].includes(driver)) {
  console.error(`--driver must be gvisor or qemu\n${usage}`);
  process.exit(2);
}
const interrupted = interruptSignal();

console.log(await header());
const seed = await seedTemplate();
console.log(`# loop: ${runs} runs, driver ${driver}, pool size ${pool}, template seed ${seed.hash.slice(0, 12)}`);

const times: RunTimes[] = [];
const failures: string[] = [];
let ts: TestServer | undefined;
let leaks: string[] = [];
let creates: Creates | undefined;
try {
  ts = await startTestServer({ BOTHY_POOL_SIZE: String(pool), BOTHY_DRIVER: driver });
  console.log(`# server ${ts.url}, home ${ts.home}`);
  // As `bothy serve` does: the pool starts filling at start-up, not at the first create.
  if (pool > 0) await ts.server.manager.warm("seed");
  let consecutive = 0;
  for (let i = 1; i <= runs && !interrupted.aborted; i++) {
    const t0 = performance.now();
    try {
      times.push(await timedRun(ts.url, ts.wsUrl));
      consecutive = 0;
    } catch (err) {
      const msg = `run ${i} (after ${secs(performance.now() - t0)}): ${(err as Error).message}`;
      failures.push(msg);
      console.log(`FAILED ${msg}`);
      if (++consecutive >= MAX_CONSECUTIVE_FAILURES) {
        console.log(`stopping: ${consecutive} failures in a row`);
        break;
      }
    }
    if (i % 10 === 0 || i === runs) {
      const last = times.slice(-10).map((t) => t.total);
      console.log(
        `${String(i).padStart(5)}/${runs}  ok ${times.length}  failed ${failures.length}  last-10 mean ${secs(mean(last))}`,
      );
    }
  }
} catch (err) {
  failures.push(`setup: ${(err as Error).message}`);
} finally {
  if (ts) {
    try {
      const found = await stopAndInspect(ts, "bench-loop", failures.length > 0);
      leaks = found.leaks;
      creates = found.creates;
      if (found.log) console.log(`# server log kept at ${found.log}`);
    } catch (err) {
      failures.push(`stop/inspect: ${(err as Error).message}`);
    }
  }
}

const totals = times.map((t) => t.total);
console.log("");
console.log(
  `runs ok: ${times.length}/${runs}, failed: ${failures.length}${interrupted.aborted ? " (interrupted)" : ""}; warm creates: ${creates?.text ?? "?"}`,
);
if (times.length > 0) {
  console.log(`s/run: mean ${secs(mean(totals))}, median ${secs(median(totals))}`);
  console.log(`  total   ${summary(totals)}`);
  for (const phase of ["create", "exec", "delete"] as const)
    console.log(`  ${phase.padEnd(7)} ${summary(times.map((t) => t[phase]))}`);
  // A sequential loop outruns the pool's refill, so warm and cold creates mix: show each kind.
  for (const [kind, sel] of [
    ["warm", true],
    ["cold", false],
  ] as const) {
    const some = times.filter((t) => (creates?.warm.has(t.id) ?? false) === sel);
    if (some.length > 0)
      console.log(
        `  ${kind} runs: total median ${secs(median(some.map((t) => t.total)))}, create ${secs(median(some.map((t) => t.create)))}, exec ${secs(median(some.map((t) => t.exec)))}, delete ${secs(median(some.map((t) => t.delete)))} (n=${some.length})`,
      );
  }
  const firstHalf = totals.slice(0, Math.floor(totals.length / 2));
  const secondHalf = totals.slice(Math.floor(totals.length / 2));
  // A drift between halves points at something accumulating (files, rows, processes).
  if (firstHalf.length > 0)
    console.log(
      `  drift: first half median ${secs(median(firstHalf))}, second half median ${secs(median(secondHalf))}`,
    );
}
for (const f of failures) console.log(`failure: ${f}`);
if (leaks.length === 0) console.log("leaks: none");
else for (const l of leaks) console.log(`leak: ${l}`);
process.exit(failures.length > 0 || leaks.length > 0 || interrupted.aborted ? 1 : 0);
