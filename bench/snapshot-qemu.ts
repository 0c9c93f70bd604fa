/**
 * bench/snapshot --driver qemu [--runs R=2]: what QEMU snapshots cost, as ratios taken in one run
 * (absolute times move with load; QEMU runs under software emulation on hosts without usable KVM):
 * - a disk snapshot of a VM that wrote 1 MiB against one that wrote 100 MiB since its template
 *   (it should grow with those bytes, not with the template), and how long each VM was frozen;
 * - a snapshot with memory (frozen for the memory save and the disk copy);
 * - create from the memory snapshot → the child's first output, against create from a disk-only
 *   snapshot of the same VM (a cold boot on the same disk) and a warm create (the warm start's
 *   restore of a template): the goal is memory child ≤ 0.2x a cold boot.
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

const usage = "usage: bench/snapshot --driver qemu [--runs R=2]";
const { flags, positional } = parseArgs(process.argv.slice(2), ["runs", "driver"], usage);
if (positional.length > 0 || flags.get("driver") !== "qemu") {
  console.error(`this script measures QEMU\n${usage}`);
  process.exit(2);
}
const runs = intArg(flags.get("runs"), 2, "--runs", 1, 20, usage);
const SHAPE = { template: "seed", vcpu: 1, memory_mib: 512 };
const MIB = 1024 * 1024;

console.log(await header());
await seedTemplate();
console.log(`# snapshot: ${runs} runs per series, QEMU`);

const ts = await startTestServer({ BOTHY_DRIVER: "qemu" });
const made: string[] = [];
const snaps: string[] = [];
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
  const remove = async (id: string): Promise<void> => {
    await api(ts.url, "DELETE", `/sandboxes/${id}?wait=true`);
    made.splice(made.indexOf(id), 1);
  };
  /** ms from `t0` until `echo ok` in `id` printed its first byte. */
  const firstOutput = (id: string, t0: number): Promise<number> => firstOutputMs(ts.wsUrl, id, t0);
  const snapshot = async (
    id: string,
    memory: boolean,
  ): Promise<{ snap: string; ms: number; bytes: number; frozen: number }> => {
    const t0 = performance.now();
    const r = await api(ts.url, "POST", `/sandboxes/${id}/snapshots`, memory ? { memory: true } : {});
    const ms = performance.now() - t0;
    if (r.status !== 201) throw new Error(`snapshot: ${r.status} ${JSON.stringify(r.json)}`);
    const snap = String(r.json["snapshot_id"]);
    snaps.push(snap);
    const created = ts.events.flatMap((e) => (e.event === "snapshot_created" && e.snapshot_id === snap ? [e] : []));
    return { snap, ms, bytes: Number(r.json["bytes"]), frozen: created[0]?.frozen_ms ?? NaN };
  };
  const drop = async (snap: string): Promise<void> => {
    await api(ts.url, "DELETE", `/snapshots/${snap}`);
    snaps.splice(snaps.indexOf(snap), 1);
  };

  // 1. Disk snapshot time against bytes written.
  const small = await create(SHAPE);
  const big = await create(SHAPE);
  await sh(small, "head -c 1048576 /dev/urandom > /root/data");
  await sh(big, "head -c 104857600 /dev/urandom > /root/data");
  const series = { small: [] as number[], big: [] as number[], smallFrozen: [] as number[], bigFrozen: [] as number[] };
  for (let i = 0; i < runs; i++) {
    const s = await snapshot(small, false);
    const b = await snapshot(big, false);
    series.small.push(s.ms);
    series.big.push(b.ms);
    series.smallFrozen.push(s.frozen);
    series.bigFrozen.push(b.frozen);
    if (i === 0) console.log(`snapshot sizes: ${(s.bytes / MIB).toFixed(1)} MiB and ${(b.bytes / MIB).toFixed(1)} MiB`);
    await drop(s.snap);
    await drop(b.snap);
  }
  await remove(big);
  console.log(
    `disk snapshot, 1 MiB written:   ${summary(series.small)}  (frozen median ${secs(median(series.smallFrozen))})`,
  );
  console.log(
    `disk snapshot, 100 MiB written: ${summary(series.big)}  (frozen median ${secs(median(series.bigFrozen))})`,
  );
  console.log(`ratio 100 MiB / 1 MiB: ${(median(series.big) / median(series.small)).toFixed(2)}x`);

  // 2. First command in a child of a memory snapshot, against a cold boot on the same disk and a warm create.
  const memRuns: number[] = [];
  const memSnapRuns: number[] = [];
  const memFrozen: number[] = [];
  const coldRuns: number[] = [];
  const warmRuns: number[] = [];
  let memBytes = 0;
  let lastIds = { child: "", cold: "", warm: "" };
  for (let i = 0; i < runs; i++) {
    const mem = await snapshot(small, true);
    const disk = await snapshot(small, false);
    memSnapRuns.push(mem.ms);
    memFrozen.push(mem.frozen);
    memBytes = mem.bytes;
    let t0 = performance.now();
    const child = await create({ snapshot: mem.snap });
    memRuns.push(await firstOutput(child, t0));
    t0 = performance.now();
    const cold = await create({ snapshot: disk.snap });
    coldRuns.push(await firstOutput(cold, t0));
    t0 = performance.now();
    const warm = await create(SHAPE);
    warmRuns.push(await firstOutput(warm, t0));
    lastIds = { child, cold, warm };
    for (const id of [child, cold, warm]) await remove(id);
    await drop(mem.snap);
    await drop(disk.snap);
  }
  console.log(
    `memory snapshot (${(memBytes / MIB).toFixed(0)} MiB): ${summary(memSnapRuns)}  (frozen median ${secs(median(memFrozen))})`,
  );
  console.log(`memory child → first output:         ${summary(memRuns)}`);
  console.log(`disk-only child (cold boot) → first output: ${summary(coldRuns)}`);
  console.log(`warm create → first output:          ${summary(warmRuns)}`);
  // Where a create's time went, by boot step (the last run's), from the server's events.
  const steps = (id: string): string =>
    JSON.stringify(
      ts.events.flatMap((e) => (e.event === "sandbox_created" && e.sandbox_id === id ? [e.steps] : []))[0] ?? {},
    );
  console.log(`boot steps (ms): memory child ${steps(lastIds.child)}`);
  console.log(`                 cold boot    ${steps(lastIds.cold)}`);
  console.log(`                 warm create  ${steps(lastIds.warm)}`);
  console.log(
    `ratio memory child / cold boot: ${(median(memRuns) / median(coldRuns)).toFixed(2)}x (goal ≤ 0.2x)   memory child / warm create: ${(median(memRuns) / median(warmRuns)).toFixed(2)}x`,
  );
} finally {
  for (const id of [...made]) await api(ts.url, "DELETE", `/sandboxes/${id}?wait=true`).catch(() => undefined);
  for (const snap of [...snaps]) await api(ts.url, "DELETE", `/snapshots/${snap}`).catch(() => undefined);
  const { leaks, log } = await stopAndInspect(ts as TestServer, "bench-snapshot-qemu");
  if (leaks.length > 0) {
    console.log(`LEAKS (server log kept in ${log ?? "?"}):\n${leaks.join("\n")}`);
    process.exitCode = 1;
  }
}
