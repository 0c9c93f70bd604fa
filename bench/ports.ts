/**
 * bench/ports [--runs R=50] [--mb M=100] [--driver gvisor|qemu] [--no-desktop]: what the port
 * proxy adds, each figure against the same request made inside the sandbox over its loopback:
 *  - latency of `GET /hello` (a small answer): through the server's proxy vs a client inside;
 *  - throughput of an M MB download: through the proxy vs a client inside.
 * Then the desktop template's memory per idle sandbox (gVisor): the sandbox's memory cgroup on the
 * host and `free` inside, with the desktop started and idle, against a seed sandbox of the same
 * size. Prints figures and ratios; no pass/fail.
 */
import { readFile } from "node:fs/promises";
import { Sandbox } from "@bothy/sdk";
import { startTestServer, type TestServer } from "../packages/server/test/helpers/test-server.ts";
import {
  cgroupMemory,
  freeUsedMib,
  header,
  intArg,
  median,
  parseArgs,
  repoRoot,
  seedTemplate,
  stopAndInspect,
} from "./bench-util.ts";

const usage = "usage: bench/ports [--runs R=50] [--mb M=100] [--driver gvisor|qemu] [--no-desktop]";
const argv = process.argv.slice(2).filter((a) => a !== "--no-desktop");
const { flags } = parseArgs(argv, ["runs", "mb", "driver"], usage);
const runs = intArg(flags.get("runs"), 50, "--runs", 1, 10_000, usage);
const mb = intArg(flags.get("mb"), 100, "--mb", 1, 10_000, usage);
const driver = flags.get("driver") ?? "gvisor";
const desktop = !process.argv.includes("--no-desktop") && driver === "gvisor";
const PORT = 8000;

/** A client run inside the sandbox on its Node: prints one JSON line of figures. */
const INSIDE_CLIENT = `
const http = require("node:http");
const [what, n] = process.argv.slice(2);
const get = (path) => new Promise((resolve, reject) => {
  const t = process.hrtime.bigint();
  http.get({ host: "127.0.0.1", port: ${PORT}, path, agent: false }, (res) => {
    let bytes = 0;
    res.on("data", (c) => (bytes += c.length));
    res.on("end", () => resolve({ ms: Number(process.hrtime.bigint() - t) / 1e6, bytes }));
  }).on("error", reject);
});
(async () => {
  if (what === "latency") {
    const xs = [];
    await get("/hello");
    for (let i = 0; i < Number(n); i++) xs.push((await get("/hello")).ms);
    xs.sort((a, b) => a - b);
    console.log(JSON.stringify({ median_ms: xs[Math.floor(xs.length / 2)] }));
  } else {
    const r = await get("/bytes?n=" + n);
    console.log(JSON.stringify({ ms: r.ms, bytes: r.bytes }));
  }
})();
`;

async function inside(sandbox: Sandbox, args: string): Promise<Record<string, number>> {
  const r = await sandbox.commands.run(`node /tmp/client.cjs ${args}`, { timeoutS: 600 });
  return JSON.parse(r.stdout.trim().split("\n").at(-1) ?? "{}") as Record<string, number>;
}

console.log(await header());
await seedTemplate();
let ts: TestServer | undefined;
try {
  ts = await startTestServer({ BOTHY_DRIVER: driver, BOTHY_POOL_SIZE: "0" });
  const sandbox = await Sandbox.create({ baseUrl: ts.url, template: "seed", vcpu: 1, memoryMib: 512 });
  const server = await readFile(`${repoRoot}packages/server/test/fixtures/port-server.mjs`);
  await sandbox.files.write("/tmp/port-server.mjs", server);
  await sandbox.files.write("/tmp/client.cjs", INSIDE_CLIENT);
  const bg = await sandbox.commands.run(`node /tmp/port-server.mjs ${PORT} > /tmp/srv.log 2>&1`, { background: true });
  bg.disconnect();
  for (let i = 0; !(await sandbox.ports.list()).some((p) => p.port === PORT); i++) {
    if (i > 300) throw new Error("the port server did not start");
    await new Promise((r) => setTimeout(r, 100));
  }
  const url = sandbox.ports.url(PORT);

  await (await fetch(`${url}hello`)).text();
  const viaProxy: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t = performance.now();
    await (await fetch(`${url}hello`)).text();
    viaProxy.push(performance.now() - t);
  }
  const proxyMs = median(viaProxy);
  const insideMs = (await inside(sandbox, `latency ${runs}`))["median_ms"] ?? NaN;
  console.log(
    `latency of GET /hello (${runs} runs, medians): proxy ${proxyMs.toFixed(2)} ms, inside over loopback ${insideMs.toFixed(2)} ms, ratio ${(proxyMs / insideMs).toFixed(1)}`,
  );

  const bytes = mb * 1_000_000;
  let t = performance.now();
  const res = await fetch(`${url}bytes?n=${bytes}`);
  let received = 0;
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) received += chunk.length;
  const proxySecs = (performance.now() - t) / 1000;
  const inner = await inside(sandbox, `bytes ${bytes}`);
  const insideSecs = (inner["ms"] ?? NaN) / 1000;
  if (received !== bytes || inner["bytes"] !== bytes)
    console.log(`WARNING: received ${received} (proxy), ${inner["bytes"]} (inside) of ${bytes} bytes`);
  console.log(
    `download of ${mb} MB: proxy ${(mb / proxySecs).toFixed(1)} MB/s, inside over loopback ${(mb / insideSecs).toFixed(1)} MB/s, ratio ${(insideSecs / proxySecs).toFixed(2)}`,
  );
  await sandbox.kill();

  if (desktop) {
    const base = await Sandbox.create({ baseUrl: ts.url, template: "seed", vcpu: 2, memoryMib: 1024 });
    const desk = await Sandbox.create({ baseUrl: ts.url, template: "desktop", vcpu: 2, memoryMib: 1024 });
    t = performance.now();
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
