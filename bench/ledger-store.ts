/**
 * bench/ledger-store [N=10] [--driver gvisor|qemu]: what the PostgreSQL ledger costs one node
 * against SQLite. Two servers side by side, one on SQLite (the default) and one on a PostgreSQL 15
 * of the script's own on loopback (BOTHY_DATABASE_URL; durability on, as SQLite's writes are
 * synced); runs alternate between them so load changes hit both alike. Prints the medians of a
 * cold create (the request until its answer), of the whole create → `echo ok` → delete loop and of
 * a GET of a sandbox (a ledger read under an HTTP round trip), and the ratios postgres/sqlite (goal
 * for the create: at most 1.3). Exits 1 on a failed run or a leak.
 */
import { api, createSandbox } from "../packages/server/test/helpers/client.ts";
import { startPostgres, type TestPostgres } from "../packages/server/test/helpers/postgres.ts";
import { startTestServer, type TestServer } from "../packages/server/test/helpers/test-server.ts";
import { header, intArg, median, parseArgs, secs, seedTemplate, stopAndInspect, timedRun } from "./bench-util.ts";

const usage = "usage: bench/ledger-store [N=10] [--driver gvisor|qemu]";
const { flags, positional } = parseArgs(process.argv.slice(2), ["driver"], usage);
const runs = intArg(positional[0], 10, "N", 1, 10_000, usage);
const driver = flags.get("driver") ?? process.env["BOTHY_DRIVER"] ?? "gvisor";
/** GETs per store per run: a read is short, so more of them for a steady median. */
const GETS = 20;

console.log(await header());
await seedTemplate();
console.log(`# ledger-store: ${runs} runs per store, driver ${driver}, PostgreSQL 15 on loopback with fsync on`);

const stores = ["sqlite", "postgres"] as const;
type Store = (typeof stores)[number];
const servers = new Map<Store, TestServer>();
const create = { sqlite: [] as number[], postgres: [] as number[] };
const loop = { sqlite: [] as number[], postgres: [] as number[] };
const get = { sqlite: [] as number[], postgres: [] as number[] };
const problems: string[] = [];
let postgres: TestPostgres | undefined;
try {
  postgres = await startPostgres({ durable: true });
  const databaseUrl = await postgres.createDatabase("bothy_bench");
  servers.set("sqlite", await startTestServer({ BOTHY_DRIVER: driver }));
  servers.set(
    "postgres",
    await startTestServer({
      BOTHY_DRIVER: driver,
      BOTHY_DATABASE_URL: databaseUrl,
      BOTHY_NODE_URL: "http://127.0.0.1:1",
    }),
  );
  const kept = new Map<Store, string>();
  for (const [store, ts] of servers) kept.set(store, await createSandbox(ts.url));
  for (let i = 0; i < runs; i++) {
    // Alternate which store goes first.
    for (const store of i % 2 === 0 ? stores : [...stores].reverse()) {
      const ts = servers.get(store);
      if (!ts) continue;
      const run = await timedRun(ts.url, ts.wsUrl);
      create[store].push(run.create);
      loop[store].push(run.total);
      for (let g = 0; g < GETS; g++) {
        const t = performance.now();
        const res = await api(ts.url, "GET", `/sandboxes/${kept.get(store) ?? ""}`);
        get[store].push(performance.now() - t);
        if (res.status !== 200) throw new Error(`${store}: GET answered ${res.status}`);
      }
    }
  }
  for (const [store, ts] of servers) await api(ts.url, "DELETE", `/sandboxes/${kept.get(store) ?? ""}?wait=true`);
} catch (err) {
  problems.push(`run: ${(err as Error).message}`);
} finally {
  for (const [store, ts] of servers) {
    const found = await stopAndInspect(ts, `bench-ledger-${store}`, problems.length > 0);
    problems.push(...found.leaks.map((l) => `leak (${store}): ${l}`));
  }
  await postgres?.stop();
}

const ratio = (a: number[], b: number[]): string => (median(a) / median(b)).toFixed(3);
const line = (what: string, xs: typeof create, fmt: (ms: number) => string, goal = ""): void => {
  if (xs.sqlite.length > 0 && xs.postgres.length > 0)
    console.log(
      `${what}, median: postgres ${fmt(median(xs.postgres))}, sqlite ${fmt(median(xs.sqlite))}, ratio ${ratio(xs.postgres, xs.sqlite)}${goal}`,
    );
};
line("cold create", create, secs, " (goal <= 1.3)");
line("create → echo → delete", loop, secs);
line("GET /sandboxes/{id}", get, (ms) => `${ms.toFixed(2)} ms`);
for (const p of problems) console.log(p);
process.exit(problems.length > 0 ? 1 : 0);
