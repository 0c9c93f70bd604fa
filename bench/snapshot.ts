/**
 * bench/snapshot [--runs R=3] [--children N=10]: what snapshots and fork cost on gVisor, as ratios
 * taken in one run (absolute times move with load):
 * - a snapshot of a sandbox that wrote 1 MiB against one that wrote 100 MiB since its template
 *   (it should grow with those bytes, not with the template's size), and how long each was frozen;
 * - fork of one child → the child's first output, against a warm create (a booted pool sandbox
 *   claimed) → first output and a cold create → first output;
 * - N children in one fork, each to its first output, against N warm creates at once;
 * - a snapshot taken with `warm: N`, then N creates from it at once (each taking a sandbox booted
 *   from the snapshot ahead) to their first outputs, against the same N warm creates, and how
 *   long the N took to boot in the background.
 */
import { api, runCommand } from "../packages/server/test/helpers/client.ts";
import { startTestServer, type TestServer } from "../packages/server/test/helpers/test-server.ts";
import {
  firstOutputMs,
  header,
  intArg,
  median,
  parseArgs,
  secs,
  seedTemplate,
  stopAndInspect,
  summary,
} from "./bench-util.ts";

const usage = "usage: bench/snapshot [--runs R=3] [--children N=10]";
const { flags, positional } = parseArgs(process.argv.slice(2), ["runs", "children"], usage);
if (positional.length > 0) {
  console.error(`unexpected argument ${positional[0]}\n${usage}`);
  process.exit(2);
}
const runs = intArg(flags.get("runs"), 3, "--runs", 1, 100, usage);
const children = intArg(flags.get("children"), 10, "--children", 1, 20, usage);
const SHAPE = { template: "seed", vcpu: 1, memory_mib: 512 };
/** A shape no pool keeps: its creates boot cold. */
const COLD_SHAPE = { template: "seed", vcpu: 1, memory_mib: 640 };

console.log(await header());
await seedTemplate();
console.log(`# snapshot: ${runs} runs per series, fork of ${children} children, gVisor`);

const ts = await startTestServer({ BOTHY_DRIVER: "gvisor", BOTHY_POOL_SIZE: String(children) });
const made: string[] = [];
try {
  const sh = async (id: string, cmd: string): Promise<void> => {
    const r = await runCommand(ts.wsUrl, id, { cmd });
    if (r.exit?.exit_code !== 0) throw new Error(`${id}: ${cmd}: ${r.stderr}`);
  };
  const create = async (body: Record<string, unknown>): Promise<string> => {
    const r = await api(ts.url, "POST", "/sandboxes", body);
    if (r.status !== 201) throw new Error(`create: ${r.status} ${JSON.stringify(r.json)}`);
    made.push(String(r.json["sandbox_id"]));
    return String(r.json["sandbox_id"]);
  };
  /** ms from `t0` until `echo ok` in `id` printed its first byte. */
  const firstOutput = (id: string, t0: number): Promise<number> => firstOutputMs(ts.wsUrl, id, t0);
  const snapshotMs = async (id: string): Promise<{ ms: number; bytes: number; frozen: number }> => {
    const t0 = performance.now();
    const r = await api(ts.url, "POST", `/sandboxes/${id}/snapshots`, {});
    const ms = performance.now() - t0;
    if (r.status !== 201) throw new Error(`snapshot: ${r.status} ${JSON.stringify(r.json)}`);
    const snap = String(r.json["snapshot_id"]);
    const created = ts.events.flatMap((e) => (e.event === "snapshot_created" && e.snapshot_id === snap ? [e] : []));
    await api(ts.url, "DELETE", `/snapshots/${snap}`);
    return { ms, bytes: Number(r.json["bytes"]), frozen: created[0]?.frozen_ms ?? NaN };
  };
  const waitPool = async (): Promise<void> => {
    const deadline = Date.now() + 300_000;
    while (ts.server.manager.poolStats().ready < children) {
      if (Date.now() > deadline) throw new Error("the warm pool did not fill in 5 min");
      await new Promise((r) => setTimeout(r, 200)); // the poll's pace
    }
  };

  // 1. Snapshot time against bytes written.
  const small = await create(SHAPE);
  const big = await create(SHAPE);
  await sh(small, "head -c 1048576 /dev/urandom > /root/data");
  await sh(big, "head -c 104857600 /dev/urandom > /root/data");
  const smallRuns: number[] = [];
  const bigRuns: number[] = [];
  const frozen: number[][] = [[], []];
  for (let i = 0; i < runs; i++) {
    const s = await snapshotMs(small);
    const b = await snapshotMs(big);
    smallRuns.push(s.ms);
    bigRuns.push(b.ms);
    frozen[0]?.push(s.frozen);
    frozen[1]?.push(b.frozen);
    if (i === 0)
      console.log(`snapshot sizes: ${(s.bytes / 1048576).toFixed(1)} MiB and ${(b.bytes / 1048576).toFixed(1)} MiB`);
  }
  console.log(`snapshot, 1 MiB written:   ${summary(smallRuns)}  (frozen median ${secs(median(frozen[0] ?? []))})`);
  console.log(`snapshot, 100 MiB written: ${summary(bigRuns)}  (frozen median ${secs(median(frozen[1] ?? []))})`);
  console.log(`ratio 100 MiB / 1 MiB: ${(median(bigRuns) / median(smallRuns)).toFixed(2)}x`);

  // 2. One child: fork → first output, against warm and cold create → first output.
  const forkOne: number[] = [];
  const warmOne: number[] = [];
  const coldOne: number[] = [];
  for (let i = 0; i < runs; i++) {
    await waitPool();
    let t0 = performance.now();
    const warm = await create(SHAPE);
    warmOne.push(await firstOutput(warm, t0));
    t0 = performance.now();
    const cold = await create(COLD_SHAPE);
    coldOne.push(await firstOutput(cold, t0));
    t0 = performance.now();
    const fork = await api(ts.url, "POST", `/sandboxes/${small}/fork`, { count: 1 });
    if (fork.status !== 201) throw new Error(`fork: ${fork.status} ${JSON.stringify(fork.json)}`);
    const child = (fork.json["sandboxes"] as Array<{ sandbox_id: string }>)[0]?.sandbox_id ?? "";
    made.push(child);
    forkOne.push(await firstOutput(child, t0));
    for (const id of [warm, cold, child]) await api(ts.url, "DELETE", `/sandboxes/${id}?wait=true`);
    await api(ts.url, "DELETE", `/snapshots/${String((fork.json["snapshot"] as { snapshot_id: string }).snapshot_id)}`);
  }
  console.log(`fork 1 → first output:    ${summary(forkOne)}`);
  console.log(`warm create → first output: ${summary(warmOne)}`);
  console.log(`cold create → first output: ${summary(coldOne)}`);
  console.log(
    `ratio fork/warm: ${(median(forkOne) / median(warmOne)).toFixed(2)}x   fork/cold: ${(median(forkOne) / median(coldOne)).toFixed(2)}x`,
  );

  // 3. N children at once against N warm creates at once (each to its first output; the last one counts).
  const forkN: number[] = [];
  const warmN: number[] = [];
  for (let i = 0; i < runs; i++) {
    await waitPool();
    let t0 = performance.now();
    const warm = await Promise.all(Array.from({ length: children }, () => create(SHAPE)));
    warmN.push(Math.max(...(await Promise.all(warm.map((id) => firstOutput(id, t0))))));
    for (const id of warm) await api(ts.url, "DELETE", `/sandboxes/${id}?wait=true`);
    t0 = performance.now();
    const fork = await api(ts.url, "POST", `/sandboxes/${small}/fork`, { count: children });
    if (fork.status !== 201) throw new Error(`fork: ${fork.status} ${JSON.stringify(fork.json)}`);
    const ids = (fork.json["sandboxes"] as Array<{ sandbox_id: string }>).map((s) => s.sandbox_id);
    made.push(...ids);
    forkN.push(Math.max(...(await Promise.all(ids.map((id) => firstOutput(id, t0))))));
    for (const id of ids) await api(ts.url, "DELETE", `/sandboxes/${id}?wait=true`);
    await api(ts.url, "DELETE", `/snapshots/${String((fork.json["snapshot"] as { snapshot_id: string }).snapshot_id)}`);
  }
  console.log(`fork ${children} → all first outputs:   ${summary(forkN)}`);
  console.log(`${children} warm creates → all first outputs: ${summary(warmN)}`);
  console.log(`ratio: ${(median(forkN) / median(warmN)).toFixed(2)}x`);

  // 4. A snapshot warmed for N, then N creates from it at once, against the N warm creates above.
  const fromWarm: number[] = [];
  const warming: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    const snap = await api(ts.url, "POST", `/sandboxes/${small}/snapshots`, { warm: children });
    if (snap.status !== 201) throw new Error(`snapshot: ${snap.status} ${JSON.stringify(snap.json)}`);
    const id = String(snap.json["snapshot_id"]);
    const deadline = Date.now() + 300_000;
    while (Number((await api(ts.url, "GET", `/snapshots/${id}`)).json["warm_ready"]) < children) {
      if (Date.now() > deadline) throw new Error("the snapshot's sandboxes did not boot in 5 min");
      await new Promise((r) => setTimeout(r, 100)); // the poll's pace
    }
    warming.push(performance.now() - t0);
    const t1 = performance.now();
    const ids = await Promise.all(Array.from({ length: children }, () => create({ snapshot: id })));
    fromWarm.push(Math.max(...(await Promise.all(ids.map((c) => firstOutput(c, t1))))));
    for (const c of ids) await api(ts.url, "DELETE", `/sandboxes/${c}?wait=true`);
    await api(ts.url, "DELETE", `/snapshots/${id}`);
  }
  console.log(`snapshot {warm: ${children}} → all booted (background): ${summary(warming)}`);
  console.log(`${children} creates from it → all first outputs: ${summary(fromWarm)}`);
  console.log(
    `ratio against ${children} warm creates: ${(median(fromWarm) / median(warmN)).toFixed(2)}x   against fork ${children}: ${(median(fromWarm) / median(forkN)).toFixed(2)}x`,
  );
} finally {
  for (const id of made) await api(ts.url, "DELETE", `/sandboxes/${id}?wait=true`).catch(() => undefined);
  const { leaks, log } = await stopAndInspect(ts as TestServer, "bench-snapshot");
  if (leaks.length > 0) {
    console.log(`LEAKS (server log kept in ${log ?? "?"}):\n${leaks.join("\n")}`);
    process.exitCode = 1;
  }
}
