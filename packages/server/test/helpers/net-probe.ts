/**
 * A probe that runs inside a sandbox on the template's own Node (the seed has no curl or dig):
 * TCP connects, HTTP GETs and DNS queries, all at once, each with its outcome and how long it took.
 */
import { api, putSandboxFile, runCommand } from "./client.ts";

export type Check =
  { get: [string, number] } | { tcp: [string, number] } | { dns: [string, string] } | { lookup: string };

export interface Outcome {
  ok: boolean;
  ms: number;
  err?: string;
  body?: string;
  addrs?: string[];
}

export interface ProbeResult {
  /** The sandbox's own non-loopback addresses. */
  addrs: Array<{ address: string; family: string | number; cidr: string }>;
  resolv: string;
  results: Record<string, Outcome>;
}

const PROBE = String.raw`
const net = require("net"), http = require("http"), dns = require("dns"), os = require("os"), fs = require("fs");
const spec = JSON.parse(fs.readFileSync("/tmp/bothy-probe.json", "utf8"));
const T = spec.timeoutMs;
const timed = (p) => { const t0 = Date.now(); return p.then((r) => ({ ...r, ms: Date.now() - t0 })); };
const tcp = (host, port) => new Promise((r) => {
  const s = net.connect({ host, port });
  let done = false;
  const fin = (x) => { if (!done) { done = true; s.destroy(); r(x); } };
  s.setTimeout(T, () => fin({ ok: false, err: "timeout" }));
  s.on("connect", () => fin({ ok: true }));
  s.on("error", (e) => fin({ ok: false, err: e.code || e.message }));
});
const get = (host, port) => new Promise((r) => {
  const req = http.get({ host, port, path: "/", timeout: T }, (res) => { let b = ""; res.on("data", (d) => (b += d)); res.on("end", () => r({ ok: true, body: b })); });
  req.on("timeout", () => req.destroy(Object.assign(new Error("timeout"), { code: "timeout" })));
  req.on("error", (e) => r({ ok: false, err: e.code || e.message }));
});
const resolve = (server, name) => new Promise((r) => {
  const res = new dns.Resolver({ timeout: spec.dnsTimeoutMs, tries: 1 });
  res.setServers([server]);
  res.resolve4(name, (e, a) => r(e ? { ok: false, err: e.code } : { ok: true, addrs: a }));
});
const lookup = (name) => new Promise((r) => dns.lookup(name, { family: 4 }, (e, a) => r(e ? { ok: false, err: e.code } : { ok: true, addrs: [a] })));
(async () => {
  const addrs = Object.values(os.networkInterfaces()).flat().filter((a) => !a.internal).map((a) => ({ address: a.address, family: a.family, cidr: a.cidr }));
  const resolv = fs.existsSync("/etc/resolv.conf") ? fs.readFileSync("/etc/resolv.conf", "utf8") : "";
  const entries = await Promise.all(Object.entries(spec.checks).map(async ([k, c]) => [k, await timed(c.get ? get(...c.get) : c.tcp ? tcp(...c.tcp) : c.dns ? resolve(...c.dns) : lookup(c.lookup))]));
  console.log(JSON.stringify({ addrs, resolv, results: Object.fromEntries(entries) }));
})();
`;

/** Runs the checks inside the sandbox, all in parallel. */
export async function probe(
  base: string,
  sandboxId: string,
  checks: Record<string, Check>,
  timeoutMs = 5000,
): Promise<ProbeResult> {
  await putSandboxFile(base, sandboxId, "/tmp/bothy-probe.cjs", PROBE);
  await putSandboxFile(
    base,
    sandboxId,
    "/tmp/bothy-probe.json",
    JSON.stringify({ checks, timeoutMs, dnsTimeoutMs: 1500 }),
  );
  const r = await runCommand(base.replace(/^http/, "ws"), sandboxId, {
    cmd: "node /tmp/bothy-probe.cjs",
    timeout_s: 60,
  });
  if (r.exit?.exit_code !== 0) throw new Error(`probe in ${sandboxId} failed: ${r.stderr || JSON.stringify(r.error)}`);
  return JSON.parse(r.stdout) as ProbeResult;
}

/** The sandbox's IPv4 address, as it sees it. */
export function ipv4Of(p: ProbeResult): string {
  const a = p.addrs.find((x) => x.family === "IPv4" || x.family === 4);
  if (!a) throw new Error(`the sandbox has no IPv4 address: ${JSON.stringify(p.addrs)}`);
  return a.address;
}

export async function sandboxNetwork(base: string, id: string): Promise<unknown> {
  return (await api(base, "GET", `/sandboxes/${id}`)).json["network"];
}
