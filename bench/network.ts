/**
 * bench/network [N] [--driver gvisor|qemu]: N sandboxes (default 20) created and deleted all at
 * once, with networking on and then off, by a real `bothy serve` inside the test topology
 * (packages/server/test/helpers/net-topology.ts: no packet leaves this machine). Prints the
 * create times both ways, the network set-up time the server logged per sandbox, and what network
 * objects of its home (namespaces, interfaces, nft chains, map elements) are left after the
 * deletes: none. Namespaces are host-wide: a concurrent test's would be counted without the tag.
 */
import { mkdtemp, rm } from "node:fs/promises";
import type { DriverName } from "@bothy/protocol";
import { api, createSandbox } from "../packages/server/test/helpers/client.ts";
import { NetTopology } from "../packages/server/test/helpers/net-topology.ts";
import { hostTag } from "../packages/server/src/util/host-names.ts";
import { median, secs } from "./bench-util.ts";

const args = process.argv.slice(2);
const n = Number(args.find((a) => /^\d+$/.test(a)) ?? 20);
const driverArg = args.includes("--driver") ? args[args.indexOf("--driver") + 1] : "gvisor";
if (driverArg !== "gvisor" && driverArg !== "qemu") throw new Error("--driver takes gvisor or qemu");
const driver: DriverName = driverArg;

interface Round {
  createMs: number[];
  /** Each measured create's boot steps (server log `sandbox_created.steps`), by step: median ms. */
  steps: Record<string, number>;
  plumbMs: number[];
  wallMs: number;
  failures: string[];
  /** The round's home's tag: the objects checked afterwards are its own, not a concurrent test's. */
  tag: string;
}

async function round(topo: NetTopology, network: boolean): Promise<Round> {
  const home = await mkdtemp("/tmp/bothy-bench-net-");
  const tag = hostTag(home);
  const server = topo.serveInHost(home, {
    BOTHY_NETWORK: network ? "on" : "off",
    BOTHY_DRIVER: driver,
    BOTHY_MAX_SANDBOXES: String(Math.max(64, n)),
  });
  const { logs } = server;
  try {
    const base = await server.url;
    // One sandbox first, so a QEMU warm-start snapshot is not part of the measured round.
    await api(base, "DELETE", `/sandboxes/${await createSandbox(base, { driver })}`);
    const failures: string[] = [];
    const createMs: number[] = [];
    const t0 = Date.now();
    await Promise.all(
      Array.from({ length: n }, async () => {
        const t = Date.now();
        try {
          const id = await createSandbox(base, { driver });
          createMs.push(Date.now() - t);
          const del = await api(base, "DELETE", `/sandboxes/${id}`);
          if (del.status !== 200) failures.push(`delete ${id}: ${del.status}`);
        } catch (err) {
          failures.push((err as Error).message);
        }
      }),
    );
    const wallMs = Date.now() - t0;
    const plumbMs = logs
      .filter((l) => l["event"] === "network_plumbed")
      .slice(1)
      .map((l) => Number(l["ms"]));
    const byStep = new Map<string, number[]>();
    for (const l of logs.filter((l) => l["event"] === "sandbox_created").slice(1))
      for (const [step, ms] of Object.entries((l["steps"] ?? {}) as Record<string, number>))
        byStep.set(step, [...(byStep.get(step) ?? []), ms]);
    const steps = Object.fromEntries([...byStep].map(([step, ms]) => [step, Math.round(median(ms))]));
    return { createMs, steps, plumbMs, wallMs, failures, tag };
  } finally {
    await server.stop(30_000);
    await rm(home, { recursive: true, force: true });
  }
}

const topo = new NetTopology();
let failed = false;
try {
  await topo.create();
  console.log(`bench/network: ${n} sandboxes (${driver}) created and deleted concurrently, networking on, then off`);
  const on = await round(topo, true);
  const leftOn = await topo.bothyObjects(on.tag);
  const off = await round(topo, false);
  const row = (name: string, r: Round) =>
    console.log(
      `  ${name.padEnd(14)} create median ${secs(median(r.createMs))}, max ${secs(Math.max(...r.createMs))}, all ${n} in ${secs(r.wallMs)}${r.failures.length ? `, ${r.failures.length} failed: ${r.failures.slice(0, 3).join("; ")}` : ""}`,
    );
  row("network on", on);
  row("network off", off);
  console.log(
    `  network set-up per sandbox (server log, under this load): median ${secs(median(on.plumbMs))}, max ${secs(Math.max(...on.plumbMs))}`,
  );
  console.log(
    `  added create time of networking (median on - median off): ${secs(median(on.createMs) - median(off.createMs))}`,
  );
  // Where the network's time goes: the boot steps (and the driver's start phases) that differ.
  const stepNames = [...new Set([...Object.keys(on.steps), ...Object.keys(off.steps)])];
  console.log(
    `  boot steps, median ms on / off: ${stepNames.map((s) => `${s} ${on.steps[s] ?? "-"} / ${off.steps[s] ?? "-"}`).join(", ")}`,
  );
  console.log(`  network objects left after the deletes: ${JSON.stringify(leftOn)}`);
  failed =
    on.failures.length + off.failures.length > 0 ||
    leftOn.netns.length + leftOn.links.length + leftOn.chains.length + leftOn.mapElements > 0;
} finally {
  await topo.destroy();
}
process.exit(failed ? 1 : 0);
