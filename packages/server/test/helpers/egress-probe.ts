/**
 * HTTP(S) requests made from inside a sandbox on the template's own Node, all at once: each says
 * where to connect (an address, so the name only travels in Host and SNI, as a transparent proxy
 * sees it), what it sends, and what came back (status and body, or the error's code).
 */
import { startBackgroundCommand } from "./background.ts";
import { putSandboxFile, runCommand } from "./client.ts";

export interface EgressCheck {
  kind: "http" | "https" | "upgrade" | "keepalive";
  /** Where the guest connects (the gateway does not care: it reads Host or SNI). */
  address: string;
  /** The Host header. */
  host: string;
  /** HTTPS: the SNI (default: `host`). */
  servername?: string;
  path?: string;
  method?: string;
  headers?: Record<string, string>;
  body?: string;
  /** keepalive: these hosts' requests, in order, on one connection. */
  hosts?: string[];
}

export interface EgressOutcome {
  ok: boolean;
  status?: number;
  body?: string;
  err?: string;
  /** keepalive: each request's status and the local port it left from (one connection: one port). */
  steps?: Array<{ status: number; port: number }>;
}

const CLIENT = String.raw`
const http = require("http"), https = require("https"), fs = require("fs");
const spec = JSON.parse(fs.readFileSync("/tmp/bothy-egress.json", "utf8"));
const T = spec.timeoutMs;
const send = (c) => new Promise((r) => {
  const lib = c.kind === "https" ? https : http;
  const opts = {
    host: c.address, port: c.kind === "https" ? 443 : 80, path: c.path || "/echo", method: c.method || "GET",
    headers: { host: c.host, ...(c.headers || {}) }, timeout: T, agent: false,
    ...(c.kind === "https" ? { servername: c.servername || c.host, ca: spec.ca } : {}),
    ...(c.kind === "upgrade" ? { headers: { host: c.host, connection: "Upgrade", upgrade: "websocket", ...(c.headers || {}) } } : {}),
  };
  const req = lib.request(opts, (res) => { let b = ""; res.on("data", (d) => (b += d)); res.on("end", () => r({ ok: true, status: res.statusCode, body: b })); });
  req.on("upgrade", (res, socket) => {
    socket.write("ping-through-the-gateway");
    socket.once("data", (d) => { socket.destroy(); r({ ok: true, status: res.statusCode, body: String(d) }); });
  });
  req.on("timeout", () => req.destroy(Object.assign(new Error("timeout"), { code: "timeout" })));
  req.on("error", (e) => r({ ok: false, err: (e.code || "") + " " + e.message }));
  req.end(c.body);
});
const keepalive = async (c) => {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const steps = [];
  for (const host of c.hosts) {
    const step = await new Promise((r) => {
      const req = http.request({ host: c.address, port: 80, path: "/echo", headers: { host }, agent, timeout: T }, (res) => {
        const port = res.socket.localPort; res.resume(); res.on("end", () => r({ status: res.statusCode, port }));
      });
      req.on("error", (e) => r({ status: 0, port: 0, err: e.code }));
      req.end();
    });
    steps.push(step);
  }
  agent.destroy();
  return { ok: true, steps };
};
(async () => {
  const entries = await Promise.all(Object.entries(spec.checks).map(async ([k, c]) => [k, await (c.kind === "keepalive" ? keepalive(c) : send(c))]));
  console.log(JSON.stringify(Object.fromEntries(entries)));
})();
`;

async function putProbe(
  base: string,
  sandboxId: string,
  checks: Record<string, EgressCheck>,
  ca: string,
  timeoutMs: number,
): Promise<void> {
  await putSandboxFile(base, sandboxId, "/tmp/bothy-egress.cjs", CLIENT);
  await putSandboxFile(base, sandboxId, "/tmp/bothy-egress.json", JSON.stringify({ checks, timeoutMs, ca }));
}

/** Runs the checks inside the sandbox, in parallel; `ca` is the PEM the HTTPS checks trust. */
export async function egressProbe(
  base: string,
  sandboxId: string,
  checks: Record<string, EgressCheck>,
  ca: string,
  timeoutMs = 15_000,
): Promise<Record<string, EgressOutcome>> {
  await putProbe(base, sandboxId, checks, ca, timeoutMs);
  const r = await runCommand(base.replace(/^http/, "ws"), sandboxId, {
    cmd: "node /tmp/bothy-egress.cjs",
    timeout_s: 90,
  });
  if (r.exit?.exit_code !== 0)
    throw new Error(`egress probe in ${sandboxId} failed: ${r.stderr || JSON.stringify(r.error)}`);
  return JSON.parse(r.stdout) as Record<string, EgressOutcome>;
}

/**
 * Starts the checks as a background command that outlives the server (a kill -9 of it, say);
 * `read` fetches their outcomes once the command has written them (undefined until then).
 */
export async function startEgressProbe(
  base: string,
  sandboxId: string,
  checks: Record<string, EgressCheck>,
  ca: string,
  timeoutMs = 15_000,
): Promise<{ read(base: string): Promise<Record<string, EgressOutcome> | undefined> }> {
  await putProbe(base, sandboxId, checks, ca, timeoutMs);
  await startBackgroundCommand(
    base,
    sandboxId,
    "node /tmp/bothy-egress.cjs > /tmp/bothy-egress.part && mv /tmp/bothy-egress.part /tmp/bothy-egress.out",
  );
  return {
    async read(now: string) {
      const res = await fetch(
        `${now}/sandboxes/${sandboxId}/files?path=${encodeURIComponent("/tmp/bothy-egress.out")}`,
      );
      if (res.status !== 200) return undefined;
      return JSON.parse(await res.text()) as Record<string, EgressOutcome>;
    },
  };
}

/** The JSON body of an outcome (the echo server's, or the gateway's problem). */
export function bodyOf(o: EgressOutcome | undefined): Record<string, unknown> {
  try {
    return JSON.parse(o?.body ?? "") as Record<string, unknown>;
  } catch {
    return { raw: o?.body, err: o?.err };
  }
}
