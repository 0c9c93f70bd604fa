/**
 * bench/egress [--requests N] [--mb M] [--driver gvisor|qemu]: the egress gateway's cost, in one
 * run of a real `bothy serve` inside the test topology (packages/server/test/helpers/net-topology.ts:
 * no packet leaves this machine). Three sandboxes side by side: one under a host policy (its HTTPS
 * passes the gateway, passed through after the SNI), one with a secret bound to the host (its
 * HTTPS is terminated: the placeholder swapped for the value, the answer decoded if need be and
 * scrubbed), and one without (straight out, the baseline). Each makes N sequential HTTPS
 * requests, every one on a new connection (TCP + TLS handshake + GET), then N on one kept-alive
 * connection, and downloads M MiB over HTTPS from the simulated internet's echo server. Prints
 * medians and the ratios to the baseline of the same run; goals for the passed-through path:
 * latency at most 1.3x, throughput at least 0.8x.
 */
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { join } from "node:path";
import type { DriverName } from "@bothy/protocol";
import { api, createSandbox, runCommand } from "../packages/server/test/helpers/client.ts";
import { NetTopology, NAMES, PUBLIC_HTTP } from "../packages/server/test/helpers/net-topology.ts";
import { median } from "./bench-util.ts";

const args = process.argv.slice(2);
const opt = (name: string, def: string): string => (args.includes(name) ? (args[args.indexOf(name) + 1] ?? def) : def);
const requests = Number(opt("--requests", "40"));
const mb = Number(opt("--mb", "100"));
const driverArg = opt("--driver", "gvisor");
if (driverArg !== "gvisor" && driverArg !== "qemu") throw new Error("--driver takes gvisor or qemu");
const driver: DriverName = driverArg;

const CLIENT = String.raw`
const https = require("https"), fs = require("fs");
const spec = JSON.parse(fs.readFileSync("/tmp/bothy-bench.json", "utf8"));
// The terminated sandbox sends its secret's placeholder, which the gateway swaps for the value.
const auth = spec.authEnv ? { authorization: "Bearer " + process.env[spec.authEnv] } : {};
const kept = new https.Agent({ keepAlive: true, maxSockets: 1 });
const get = (path, sink, agent = false) => new Promise((resolve, reject) => {
  const req = https.get({ host: spec.address, port: 443, path, servername: spec.host, headers: { host: spec.host, ...auth }, ca: spec.ca, agent }, (res) => {
    let n = 0;
    res.on("data", (d) => { n += d.length; if (!sink) return; });
    res.on("end", () => (res.statusCode === 200 ? resolve(n) : reject(new Error("status " + res.statusCode))));
  });
  req.on("error", reject);
});
(async () => {
  const lat = [];
  for (let i = 0; i < spec.requests; i++) { const t = process.hrtime.bigint(); await get("/", false); lat.push(Number(process.hrtime.bigint() - t) / 1e6); }
  const keptLat = [];
  await get("/", false, kept);
  for (let i = 0; i < spec.requests; i++) { const t = process.hrtime.bigint(); await get("/", false, kept); keptLat.push(Number(process.hrtime.bigint() - t) / 1e6); }
  kept.destroy();
  const t = process.hrtime.bigint();
  const n = await get("/bytes/" + spec.mb, true);
  const s = Number(process.hrtime.bigint() - t) / 1e9;
  console.log(JSON.stringify({ lat, keptLat, bytes: n, seconds: s }));
})().catch((e) => { console.error(e.message); process.exit(1); });
`;

interface Result {
  lat: number[];
  keptLat: number[];
  bytes: number;
  seconds: number;
}

async function measure(base: string, id: string, ca: string, authEnv?: string): Promise<Result> {
  const put = async (path: string, body: string) => {
    const res = await fetch(`${base}/sandboxes/${id}/files?path=${encodeURIComponent(path)}`, {
      method: "PUT",
      headers: { "content-type": "application/octet-stream" },
      body,
    });
    if (res.status !== 200) throw new Error(`writing ${path}: ${res.status} ${await res.text()}`);
  };
  await put("/tmp/bothy-bench.cjs", CLIENT);
  await put(
    "/tmp/bothy-bench.json",
    JSON.stringify({ address: PUBLIC_HTTP, host: NAMES.api, ca, requests, mb, ...(authEnv ? { authEnv } : {}) }),
  );
  const r = await runCommand(base.replace(/^http/, "ws"), id, { cmd: "node /tmp/bothy-bench.cjs", timeout_s: 600 });
  if (r.exit?.exit_code !== 0) throw new Error(`bench client in ${id} failed: ${r.stderr || JSON.stringify(r.error)}`);
  return JSON.parse(r.stdout) as Result;
}

const topo = new NetTopology();
const home = await mkdtemp("/tmp/bothy-bench-egress-");
let failed = false;
try {
  await topo.create();
  const server = topo.serveInHost(home, { BOTHY_DRIVER: driver, NODE_EXTRA_CA_CERTS: topo.caFile });
  try {
    const base = await server.url;
    const gated = await createSandbox(base, { driver, policy: { allow_hosts: [NAMES.api] } });
    const direct = await createSandbox(base, { driver });
    const secret = { value: `bench-${randomBytes(16).toString("hex")}`, hosts: [NAMES.api] };
    const put = await api(base, "PUT", "/secrets/bench", secret);
    if (put.status !== 201) throw new Error(`PUT /secrets/bench: ${put.status} ${JSON.stringify(put.json)}`);
    const terminated = await createSandbox(base, {
      driver,
      policy: { allow_hosts: [NAMES.api] },
      secrets: ["bench"],
    });
    // The terminated sandbox's HTTPS comes with a leaf of bothy's egress CA.
    const egressCa = await readFile(join(home, "secrets", "egress-ca.crt"), "utf8");
    console.log(
      `bench/egress (${driver}): ${requests} HTTPS requests on new connections, ${requests} on one kept-alive connection, and a ${mb} MiB HTTPS download; through the gateway (passed through, and terminated with a secret) vs straight out`,
    );
    // Alternate, so all see the same load; the first round of each warms caches up.
    const rounds: Record<"gated" | "terminated" | "direct", Result[]> = { gated: [], terminated: [], direct: [] };
    for (let i = 0; i < 2; i++) {
      rounds.direct.push(await measure(base, direct, topo.caPem));
      rounds.gated.push(await measure(base, gated, topo.caPem));
      rounds.terminated.push(await measure(base, terminated, `${egressCa}\n${topo.caPem}`, "BENCH"));
    }
    const sum = (k: "gated" | "terminated" | "direct") => {
      const lat = median(rounds[k].flatMap((r) => r.lat));
      const kept = median(rounds[k].flatMap((r) => r.keptLat));
      const mibps = median(rounds[k].map((r) => r.bytes / 1048576 / r.seconds));
      return { lat, kept, mibps };
    };
    const g = sum("gated");
    const t = sum("terminated");
    const d = sum("direct");
    const line = (name: string, r: typeof g) =>
      console.log(
        `  ${name.padEnd(21)} new connection ${r.lat.toFixed(1)} ms, kept-alive ${r.kept.toFixed(1)} ms, download ${r.mibps.toFixed(1)} MiB/s (medians)`,
      );
    line("straight out:", d);
    line("through gateway:", g);
    line("terminated (secret):", t);
    const ratios = (r: typeof g): string =>
      `latency ${(r.lat / d.lat).toFixed(2)}x on a new connection, ${(r.kept / d.kept).toFixed(2)}x kept alive; throughput ${(r.mibps / d.mibps).toFixed(2)}x`;
    console.log(`  ratios to straight out, passed through: ${ratios(g)} (goals: latency <= 1.3x, throughput >= 0.8x)`);
    console.log(`  ratios to straight out, terminated:     ${ratios(t)}`);
    const audit = (await api(base, "GET", `/sandboxes/${gated}/audit?type=egress.allowed&limit=1000`)).json[
      "events"
    ] as unknown[];
    console.log(`  audit: ${audit.length} egress.allowed events for the gated sandbox (one per connection)`);
    for (const id of [gated, terminated, direct]) await api(base, "DELETE", `/sandboxes/${id}?wait=true`);
  } finally {
    await server.stop(30_000);
  }
  const left = await topo.bothyObjects();
  console.log(`  network objects left: ${JSON.stringify(left)}`);
  failed = left.chains.length + left.mapElements > 0;
} catch (err) {
  console.error(err);
  failed = true;
} finally {
  await topo.destroy();
  await rm(home, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
