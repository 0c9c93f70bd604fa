/**
 * bench/cluster [N=10]: what forwarding between nodes costs (issue #28). Two real `bothy serve`
 * nodes on one PostgreSQL 15 of the script's own (test/helpers/cluster-nodes.ts), gVisor; node-b is
 * drained, so every sandbox runs on node-a. Each run times, through the owner (node-a) and through
 * the other node (node-b, which forwards every call and places the create on node-a), alternating
 * which goes first: a command round trip (`echo ok` over the command WebSocket, to a sandbox kept
 * for the script) and the whole create → `echo ok` → delete loop. Prints the medians and the ratios
 * forwarded/owner (goal: at most 1.2). Creates per second with 1, 2 and 3 nodes are not measured
 * here yet. Exits 1 on a failed run or a sandbox left behind.
 */
import { api, createSandbox, runCommand } from "../packages/server/test/helpers/client.ts";
import { startClusterNodes, type ClusterNodes } from "../packages/server/test/helpers/cluster-nodes.ts";
import { header, intArg, median, parseArgs, secs, seedTemplate, timedRun, withTimeout } from "./bench-util.ts";

const usage = "usage: bench/cluster [N=10]";
const { positional } = parseArgs(process.argv.slice(2), [], usage);
const runs = intArg(positional[0], 10, "N", 1, 10_000, usage);
/** Round trips per path per run: one is short, so more of them for a steady median. */
const TRIPS = 10;

console.log(await header());
await seedTemplate();
console.log(`# cluster: ${runs} runs per path, 2 nodes on loopback, gVisor, node-b drained (every sandbox on node-a)`);

const paths = ["owner", "forwarded"] as const;
type Path = (typeof paths)[number];
const trip = { owner: [] as number[], forwarded: [] as number[] };
const loop = { owner: [] as number[], forwarded: [] as number[] };
const problems: string[] = [];
let cluster: ClusterNodes | undefined;
try {
  cluster = await startClusterNodes({ count: 2 });
  const [owner, other] = cluster.nodes;
  if (!owner || !other) throw new Error("the cluster has fewer than two nodes");
  const drain = await api(owner.url, "POST", `/nodes/${other.id}/drain`);
  if (drain.status !== 200) throw new Error(`drain answered ${drain.status}`);
  const via: Record<Path, string> = { owner: owner.url, forwarded: other.url };
  const kept = await createSandbox(owner.url);
  for (let i = 0; i < runs; i++) {
    for (const path of i % 2 === 0 ? paths : [...paths].reverse()) {
      const url = via[path];
      const ws = url.replace(/^http/, "ws");
      for (let t = 0; t < TRIPS; t++) {
        const t0 = performance.now();
        const r = await withTimeout(
          runCommand(ws, kept, { cmd: "echo ok" }, { keepEvents: false }),
          `echo via ${path}`,
        );
        trip[path].push(performance.now() - t0);
        if (r.stdout !== "ok\n") throw new Error(`${path}: echo ok gave ${JSON.stringify(r.stdout)}`);
      }
      const run = await timedRun(url, ws);
      loop[path].push(run.total);
      const rows = await cluster.query<{ node_id: string }>("SELECT node_id FROM sandboxes WHERE id = $1", [run.id]);
      if (rows[0]?.node_id !== owner.id) throw new Error(`${run.id} ran on ${rows[0]?.node_id}, not ${owner.id}`);
    }
  }
  await api(owner.url, "DELETE", `/sandboxes/${kept}?wait=true`);
  const left = await cluster.query("SELECT id FROM sandboxes WHERE state NOT IN ('deleted', 'failed')");
  if (left.length > 0) problems.push(`left behind: ${JSON.stringify(left)}`);
} catch (err) {
  problems.push(`run: ${(err as Error).message}`);
} finally {
  await cluster?.stop();
}

const line = (what: string, xs: typeof trip, fmt: (ms: number) => string): void => {
  if (xs.owner.length > 0 && xs.forwarded.length > 0)
    console.log(
      `${what}, median: forwarded ${fmt(median(xs.forwarded))}, owner ${fmt(median(xs.owner))}, ratio ${(median(xs.forwarded) / median(xs.owner)).toFixed(3)} (goal <= 1.2)`,
    );
};
line("command round trip", trip, (ms) => `${ms.toFixed(1)} ms`);
line("create → echo → delete", loop, secs);
for (const p of problems) console.log(p);
process.exit(problems.length > 0 ? 1 : 0);
