/**
 * bench/ports [--runs R=50] [--mb M=100] [--driver gvisor|qemu] [--no-desktop] [--cpu-prof DIR]: what the port
 * proxy adds, each figure against the same request made inside the sandbox over its loopback, on
 * both of its paths (api/port-dialer.ts), in one run:
 *  - direct: sandbox networking on, the server dials the sandbox's own address;
 *  - channel: networking off, the bytes go over the guest channel in frames;
 * for each, the latency of `GET /hello` (a small answer; medians of R) and the throughput of an
 * M MB download, through the proxy vs a client inside, as ratios (goals: latency <= 1.5x, throughput
 * >= 0.8x of inside). Both servers run in the network tests' topology
 * (packages/server/test/helpers/net-topology.ts: no packet leaves this machine); the client reaches
 * them over its control link, so both paths pay the same hop. Each round checks by the server's
 * `bothy_port_connections_total` that its connections took the path it names.
 * Then the desktop template's memory per idle sandbox (gVisor): the sandbox's memory cgroup on the
 * host and `free` inside, with the desktop started and idle, against a seed sandbox of the same
 * size. Prints figures and ratios; no pass/fail. `--cpu-prof DIR`: each round's server writes a V8
 * CPU profile there (open it in Chrome's DevTools; it slows the server, so its figures are not the
 * bench's). `--steps`: each round's server also times the proxy's steps per request
 * (bench/ports-steps.mjs: hooks, lookup, upstream, relay) and the round prints their medians beside
 * the floor, so what the proxy adds is split by step. `--runsc-flags "A;B"`: one direct round per
 * set of runsc flags (`default` for none), the channel round left out: what gVisor's own options
 * move the floor by.
 */
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { promisify } from "node:util";
import { dirname, join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { Sandbox } from "@bothy/sdk";
import type { DriverName } from "@bothy/protocol";
import { NetTopology } from "../packages/server/test/helpers/net-topology.ts";
import { startTestServer, type TestServer } from "../packages/server/test/helpers/test-server.ts";
import { hostTag } from "../packages/server/src/util/host-names.ts";
import {
  cgroupMemory,
  freeUsedMib,
  header,
  intArg,
  median,
  parseArgs,
  repoRoot,
  RUNSC,
  seedTemplate,
  stopAndInspect,
} from "./bench-util.ts";

const usage =
  'usage: bench/ports [--runs R=50] [--mb M=100] [--driver gvisor|qemu] [--no-desktop] [--cpu-prof DIR] [--steps] [--runsc-flags "default;--flag=x ..."]';
const argv = process.argv.slice(2).filter((a) => a !== "--no-desktop" && a !== "--steps");
const { flags } = parseArgs(argv, ["runs", "mb", "driver", "cpu-prof", "runsc-flags"], usage);
const steps = process.argv.includes("--steps");
/** runsc flag sets for the direct rounds ("" for none); undefined: one direct and one channel round as usual. */
const runscVariants = flags
  .get("runsc-flags")
  ?.split(";")
  .map((v) => (v.trim() === "default" ? "" : v.trim()));
const cpuProf = flags.get("cpu-prof");
const runs = intArg(flags.get("runs"), 50, "--runs", 1, 10_000, usage);
const mb = intArg(flags.get("mb"), 100, "--mb", 1, 10_000, usage);
const driverArg = flags.get("driver") ?? "gvisor";
if (driverArg !== "gvisor" && driverArg !== "qemu") throw new Error(usage);
const driver: DriverName = driverArg;
const desktop = !process.argv.includes("--no-desktop") && driver === "gvisor";
const PORT = 8000;
const execFileP = promisify(execFile);

/**
 * One client for every figure, run on Node: inside the sandbox (base http://127.0.0.1:PORT/), in
 * the server's namespace straight to the sandbox's address (the direct path's floor, no proxy), and
 * here through the proxy (the port's URL). `latency`: a new connection per GET, as a page's first
 * request makes; `latency-ka`: one kept-alive connection for all, as a page's later ones. Prints
 * one JSON line of figures.
 */
const CLIENT = `
const http = require("node:http");
const [what, n, base] = process.argv.slice(2);
const key = process.env.BENCH_API_KEY;
// The phase names the request in the server's step records (--steps); the app ignores it.
const headers = { "x-bench-phase": what, ...(key ? { authorization: "Bearer " + key } : {}) };
const agent = what === "latency-ka" ? new http.Agent({ keepAlive: true, maxSockets: 1 }) : false;
const get = (path) => new Promise((resolve, reject) => {
  const t = process.hrtime.bigint();
  http.get(new URL(path, base), { agent, headers }, (res) => {
    let bytes = 0;
    let head = "";
    res.on("data", (c) => {
      if (res.statusCode !== 200 && head.length < 500) head += c;
      bytes += c.length;
    });
    res.on("end", () => {
      if (res.statusCode !== 200) console.error(res.statusCode + " " + head);
      resolve({ ms: Number(process.hrtime.bigint() - t) / 1e6, bytes });
    });
  }).on("error", reject);
});
(async () => {
  if (what.startsWith("latency")) {
    const xs = [];
    await get("hello");
    for (let i = 0; i < Number(n); i++) xs.push((await get("hello")).ms);
    xs.sort((a, b) => a - b);
    console.log(JSON.stringify({ median_ms: xs[Math.floor(xs.length / 2)] }));
    process.exit(0);
  } else {
    const r = await get("bytes?n=" + n);
    console.log(JSON.stringify({ ms: r.ms, bytes: r.bytes }));
  }
})();
`;

const lastLine = (out: string): Record<string, number> =>
  JSON.parse(out.trim().split("\n").at(-1) ?? "{}") as Record<string, number>;

/** The client in this process's namespace, where the proxy's URL is reached. */
async function here(script: string, args: string[]): Promise<Record<string, number>> {
  const { stdout, stderr } = await execFileP(process.execPath, [script, ...args], {
    maxBuffer: 1 << 20,
    env: { ...process.env, BENCH_API_KEY: process.env["BOTHY_API_KEY"] ?? "" },
  });
  if (stderr.trim() !== "") console.log(`  client: ${stderr.trim()}`);
  return lastLine(stdout);
}

async function inside(sandbox: Sandbox, args: string): Promise<Record<string, number>> {
  const r = await sandbox.commands.run(`node /tmp/client.cjs ${args} http://127.0.0.1:${PORT}/`, { timeoutS: 600 });
  return lastLine(r.stdout);
}

interface Figures {
  /** Through the proxy with the client the inside figures use (a new connection per GET). */
  proxyMs: number;
  proxyMBs: number;
  /** The same GETs on one kept-alive connection: through the proxy, and inside. */
  proxyKaMs: number;
  insideKaMs: number;
  /** Through the proxy with fetch (undici: one kept-alive connection, a WHATWG stream body). */
  fetchMs: number;
  fetchMBs: number;
  insideMs: number;
  insideMBs: number;
  /** Connections by route (bothy_port_connections_total) the round added. */
  routes: Record<string, number>;
  /** The same client in the server's namespace straight to the sandbox's address (direct round only). */
  floor?: { ms: number; kaMs: number; MBs: number };
}

async function routes(base: string): Promise<Record<string, number>> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^bothy_port_connections_total\{path="(\w+)"(?:,why="(\w+)")?\} (\d+)$/gm))
    out[m[2] ?? m[1]!] = Number(m[3]);
  return out;
}

async function fetchFigures(url: string, bytes: number): Promise<{ ms: number; MBs: number }> {
  await (await fetch(`${url}hello`)).text();
  const times: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t = performance.now();
    await (await fetch(`${url}hello`)).text();
    times.push(performance.now() - t);
  }
  const t = performance.now();
  const res = await fetch(`${url}bytes?n=${bytes}`);
  let received = 0;
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) received += chunk.length;
  const secs = (performance.now() - t) / 1000;
  if (received !== bytes) console.log(`WARNING: fetch received ${received} of ${bytes} bytes`);
  return { ms: median(times), MBs: mb / secs };
}

/** One sandbox with the port server; latency and throughput through the proxy and inside. */
async function measure(base: string, floorIn?: NetTopology): Promise<Figures> {
  const sandbox = await Sandbox.create({ baseUrl: base, template: "seed", vcpu: 1, memoryMib: 512 });
  // Only the network namespace is entered for the floor: the script's file is seen there as here.
  const script = join(await mkdtemp("/tmp/bothy-bench-client-"), "client.cjs");
  try {
    const server = await readFile(`${repoRoot}packages/server/test/fixtures/port-server.mjs`);
    await sandbox.files.write("/tmp/port-server.mjs", server);
    await sandbox.files.write("/tmp/client.cjs", CLIENT);
    await writeFile(script, CLIENT);
    const bg = await sandbox.commands.run(`node /tmp/port-server.mjs ${PORT} > /tmp/srv.log 2>&1`, {
      background: true,
    });
    bg.disconnect();
    for (let i = 0; !(await sandbox.ports.list()).some((p) => p.port === PORT); i++) {
      if (i > 300) throw new Error("the port server did not start");
      await new Promise((r) => setTimeout(r, 100));
    }
    const url = sandbox.ports.url(PORT);
    const before = await routes(base);
    const bytes = mb * 1_000_000;

    const proxyMs = (await here(script, ["latency", String(runs), url]))["median_ms"] ?? NaN;
    const insideMs = (await inside(sandbox, `latency ${runs}`))["median_ms"] ?? NaN;
    const proxyKaMs = (await here(script, ["latency-ka", String(runs), url]))["median_ms"] ?? NaN;
    const insideKaMs = (await inside(sandbox, `latency-ka ${runs}`))["median_ms"] ?? NaN;
    const viaProxy = await here(script, ["bytes", String(bytes), url]);
    const inner = await inside(sandbox, `bytes ${bytes}`);
    if (viaProxy["bytes"] !== bytes || inner["bytes"] !== bytes)
      console.log(`WARNING: received ${viaProxy["bytes"]} (proxy), ${inner["bytes"]} (inside) of ${bytes} bytes`);
    const viaFetch = await fetchFigures(url, bytes);
    const after = await routes(base);
    const added = Object.fromEntries(
      Object.entries(after)
        .map(([k, v]) => [k, v - (before[k] ?? 0)] as const)
        .filter(([, v]) => v > 0),
    );
    let floor: Figures["floor"];
    if (floorIn) {
      // The sandbox's address: one above the host's end of its link, which its app sees as the peer.
      const peer = (await fetch(`${url}hello`)).headers.get("x-seen-peer") ?? "";
      const addr = `http://${peer.replace(/\d+$/, (x) => String(Number(x) + 1))}:${PORT}/`;
      const onHost = async (args: string[]): Promise<Record<string, number>> =>
        lastLine(await floorIn.inHost(process.execPath, [script, ...args, addr]));
      const ms = (await onHost(["latency", String(runs)]))["median_ms"] ?? NaN;
      const kaMs = (await onHost(["latency-ka", String(runs)]))["median_ms"] ?? NaN;
      const secs = ((await onHost(["bytes", String(bytes)]))["ms"] ?? NaN) / 1000;
      floor = { ms, kaMs, MBs: mb / secs };
    }
    return {
      proxyMs,
      proxyKaMs,
      insideKaMs,
      proxyMBs: mb / ((viaProxy["ms"] ?? NaN) / 1000),
      fetchMs: viaFetch.ms,
      fetchMBs: viaFetch.MBs,
      insideMs,
      insideMBs: mb / ((inner["ms"] ?? NaN) / 1000),
      routes: added,
      ...(floor ? { floor } : {}),
    };
  } finally {
    await rm(dirname(script), { recursive: true, force: true });
    await sandbox.kill();
  }
}

function report(path: string, f: Figures): void {
  const pad = "".padEnd(8);
  console.log(
    `  ${path.padEnd(8)} GET /hello (${runs} runs, medians, a new connection each): proxy ${f.proxyMs.toFixed(2)} ms, inside ${f.insideMs.toFixed(2)} ms, ratio ${(f.proxyMs / f.insideMs).toFixed(2)}x (goal <= 1.5x)`,
  );
  console.log(
    `  ${pad} GET /hello on one kept-alive connection: proxy ${f.proxyKaMs.toFixed(2)} ms, inside ${f.insideKaMs.toFixed(2)} ms, ratio ${(f.proxyKaMs / f.insideKaMs).toFixed(2)}x (goal <= 1.5x)`,
  );
  console.log(
    `  ${pad} ${mb} MB download: proxy ${f.proxyMBs.toFixed(1)} MB/s, inside ${f.insideMBs.toFixed(1)} MB/s, ratio ${(f.proxyMBs / f.insideMBs).toFixed(2)} (goal >= 0.8)`,
  );
  console.log(
    `  ${pad} through the proxy with fetch (one kept-alive connection): GET ${f.fetchMs.toFixed(2)} ms (${(f.fetchMs / f.insideMs).toFixed(2)}x), download ${f.fetchMBs.toFixed(1)} MB/s (${(f.fetchMBs / f.insideMBs).toFixed(2)})`,
  );
  if (f.floor)
    console.log(
      `  ${pad} floor, the same client on the host straight to the sandbox's address (no proxy): ${f.floor.ms.toFixed(2)} ms (${(f.floor.ms / f.insideMs).toFixed(2)}x inside), kept-alive ${f.floor.kaMs.toFixed(2)} ms (${(f.floor.kaMs / f.insideKaMs).toFixed(2)}x), ${f.floor.MBs.toFixed(1)} MB/s (${(f.floor.MBs / f.insideMBs).toFixed(2)} of inside)`,
    );
  console.log(`  ${pad} connections by route: ${JSON.stringify(f.routes)}`);
}

/** One proxied request's steps as bench/ports-steps.mjs records them (ms; null where a step was not seen). */
interface StepRecord {
  phase: string;
  hooks: number | null;
  lookup: number | null;
  upstream: number | null;
  relay: number | null;
  flush: number | null;
  server: number | null;
  bytes: number;
  chunks: number;
  pauses: number;
  reused: boolean | null;
}

const STEP_NAMES = ["hooks", "lookup", "upstream", "relay", "server", "flush"] as const;

/** The medians of each step by the client's phase, with the floor's time for the same request beside. */
function reportSteps(records: StepRecord[], f: Figures): void {
  const pad = "".padEnd(8);
  const of = (xs: Array<number | null>): number => median(xs.filter((x): x is number => x !== null));
  const floors: Record<string, number | undefined> = { latency: f.floor?.ms, "latency-ka": f.floor?.kaMs };
  const client: Record<string, number> = { latency: f.proxyMs, "latency-ka": f.proxyKaMs };
  for (const phase of ["latency", "latency-ka", "bytes"]) {
    const rs = records.filter((r) => r.phase === phase);
    if (rs.length === 0) continue;
    const parts = STEP_NAMES.map((n) => `${n} ${of(rs.map((r) => r[n])).toFixed(2)}`).join(", ");
    const reused = rs.filter((r) => r.reused === true).length;
    let line = `  ${pad} steps in the server, ${phase} (${rs.length} requests, medians, ms): ${parts}; upstream socket reused ${reused}/${rs.length}`;
    const seen = client[phase];
    const floor = floors[phase];
    if (seen !== undefined)
      line += `; the client saw ${seen.toFixed(2)}, ${(seen - of(rs.map((r) => r.server))).toFixed(2)} of it outside the server's steps`;
    if (seen !== undefined && floor !== undefined)
      line += `; no-proxy floor ${floor.toFixed(2)}, so the proxy adds ${(seen - floor).toFixed(2)}`;
    const body = rs[0];
    if (phase === "bytes" && body !== undefined)
      line += `; body ${body.bytes} bytes in ${body.chunks} chunks (${(body.bytes / Math.max(1, body.chunks) / 1024).toFixed(1)} KiB each), paused ${body.pauses} times for the client`;
    console.log(line);
  }
}

/** A runsc that adds `runscFlags` before bothy's own arguments (global flags reach `runsc boot` too). */
async function runscWith(dir: string, runscFlags: string): Promise<string> {
  const file = join(dir, "runsc-with-flags");
  const words = runscFlags.split(/\s+/).filter(Boolean);
  for (const w of words) if (!/^--?[a-z0-9-]+(=[A-Za-z0-9._:-]+)?$/.test(w)) throw new Error(`not a runsc flag: ${w}`);
  await writeFile(file, `#!/bin/sh\nexec ${JSON.stringify(RUNSC)} ${words.join(" ")} "$@"\n`, { mode: 0o755 });
  return file;
}

console.log(await header());
await seedTemplate();
const topo = new NetTopology();
let failed = false;
const rounds =
  runscVariants === undefined
    ? [
        { network: true, runscFlags: "" },
        { network: false, runscFlags: "" },
      ]
    : runscVariants.map((runscFlags) => ({ network: true, runscFlags }));
try {
  await topo.create();
  console.log(`bench/ports (${driver}): through the port proxy vs a client inside the sandbox over its loopback`);
  for (const { network, runscFlags } of rounds) {
    const home = await mkdtemp("/tmp/bothy-bench-ports-");
    const stepsFile = join(home, "steps.jsonl");
    const server = topo.serveInHost(
      home,
      {
        BOTHY_NETWORK: network ? "on" : "off",
        BOTHY_DRIVER: driver,
        ...(runscFlags === "" ? {} : { BOTHY_RUNSC: await runscWith(home, runscFlags) }),
        ...(steps ? { BENCH_STEPS_FILE: stepsFile } : {}),
      },
      [
        ...(cpuProf === undefined ? [] : ["--cpu-prof", `--cpu-prof-dir=${resolve(cpuProf)}`]),
        ...(steps ? [`--import=${pathToFileURL(join(repoRoot, "bench/ports-steps.mjs")).href}`] : []),
      ],
    );
    let figures: Figures | undefined;
    const path = network ? "direct" : "channel";
    try {
      if (runscFlags !== "") console.log(`  runsc flags: ${runscFlags}`);
      figures = await measure(await server.url, network ? topo : undefined);
      report(path, figures);
      const want = network ? "direct" : "no_network";
      if (Object.keys(figures.routes).some((r) => r !== want)) {
        console.log(`  WARNING: the ${path} round's connections took other routes too`);
        failed = true;
      }
    } finally {
      await server.stop(30_000);
      if (steps && figures) {
        const text = await readFile(stepsFile, "utf8").catch(() => "");
        const records = text
          .split("\n")
          .filter((l) => l !== "")
          .map((l) => JSON.parse(l) as StepRecord);
        if (records.length === 0) console.log("  WARNING: the server wrote no step records");
        reportSteps(records, figures);
      }
      const left = await topo.bothyObjects(hostTag(home));
      if (left.netns.length + left.links.length + left.chains.length + left.mapElements > 0) {
        console.log(`  network objects left: ${JSON.stringify(left)}`);
        failed = true;
      }
      await rm(home, { recursive: true, force: true });
    }
  }
} finally {
  await topo.destroy();
}

let ts: TestServer | undefined;
try {
  if (desktop) {
    ts = await startTestServer({ BOTHY_DRIVER: driver, BOTHY_POOL_SIZE: "0" });
    const base = await Sandbox.create({ baseUrl: ts.url, template: "seed", vcpu: 2, memoryMib: 1024 });
    const desk = await Sandbox.create({ baseUrl: ts.url, template: "desktop", vcpu: 2, memoryMib: 1024 });
    const t = performance.now();
    await desk.desktop.start();
    const startSecs = (performance.now() - t) / 1000;
    // Idle: Chromium settles after its first seconds (it loads its components once).
    await new Promise((r) => setTimeout(r, 15_000));
    const [deskHost, baseHost] = [await cgroupMemory(desk.sandboxId), await cgroupMemory(base.sandboxId)];
    const [deskFree, baseFree] = [await freeUsedMib(desk), await freeUsedMib(base)];
    const mib = (b: number | undefined): string => (b === undefined ? "?" : `${(b / 1024 / 1024).toFixed(0)} MiB`);
    console.log(
      `desktop (gVisor, 1024 MiB sandbox): start ${startSecs.toFixed(1)} s; idle after start: host memory cgroup ${mib(deskHost)} (seed sandbox ${mib(baseHost)}), \`free\` used inside ${deskFree} MiB (seed ${baseFree} MiB)`,
    );
    await desk.kill();
    await base.kill();
  }
} finally {
  if (ts) {
    const { leaks } = await stopAndInspect(ts, "ports");
    console.log(leaks.length === 0 ? "leaks: none" : `leaks:\n  ${leaks.join("\n  ")}`);
  }
}
process.exit(failed ? 1 : 0);
