/**
 * What a sandbox's code cannot get past the gateway, from inside a real sandbox in the network
 * lab (helpers/net-topology.ts): a secret's value echoed back by a bound host base64-encoded or
 * compressed (the wan fixture's `/hostile/CODING`), a path that climbs out of a prefix rule, and
 * what an approval of terminated HTTPS shows. The attacker's code undoes any coding an answer
 * names before it looks for the value, as real code would.
 */
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { api, createSandbox, deleteSandbox, putSandboxFile, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { recoverable } from "./helpers/echo-leaks.ts";
import { useNetLab } from "./helpers/net-lab.ts";
import { NAMES, PUBLIC_HTTP } from "./helpers/net-topology.ts";

const root = process.getuid?.() === 0;
const gvisor = testDrivers().find((d) => d.name === "gvisor") ?? {
  name: "gvisor",
  missing: "BOTHY_TEST_DRIVERS to name it",
};

interface Check {
  kind: "http" | "https";
  host: string;
  path: string;
  method?: string;
  headers?: Record<string, string>;
  body?: string;
}
interface Answer {
  status: number;
  headers?: Record<string, string>;
  body?: string;
  err?: string;
}

/** The sandbox's code: sends each check in turn and prints what came back, every coding undone. */
const ATTACKER = String.raw`
const http = require("http"), https = require("https"), zlib = require("zlib"), fs = require("fs");
const spec = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const undo = { gzip: zlib.gunzipSync, deflate: zlib.inflateSync, br: zlib.brotliDecompressSync };
const send = (c) => new Promise((resolve) => {
  const lib = c.kind === "https" ? https : http;
  const req = lib.request({
    host: spec.address, port: c.kind === "https" ? 443 : 80, path: c.path, method: c.method || "GET",
    headers: { host: c.host, ...(c.headers || {}) }, servername: c.host, ca: spec.ca, agent: false, timeout: 120000,
  }, (res) => {
    const chunks = [];
    res.on("data", (d) => chunks.push(d));
    res.on("end", () => {
      let body = Buffer.concat(chunks);
      const codings = String(res.headers["content-encoding"] || "").split(",").map((s) => s.trim()).filter(Boolean);
      for (const c of codings.reverse()) try { body = undo[c] ? undo[c](body) : body; } catch {}
      resolve({ status: res.statusCode, headers: res.headers, body: body.toString("latin1") });
    });
  });
  req.on("timeout", () => req.destroy(new Error("timeout")));
  req.on("error", (e) => resolve({ status: 0, err: (e.code || "") + " " + e.message }));
  req.end(c.body);
});
(async () => {
  const out = {};
  for (const [k, c] of Object.entries(spec.checks)) out[k] = await send(c);
  console.log(JSON.stringify(out));
})();
`;

describe.skipIf(!root)("egress: echoes, paths and excerpts as a sandbox meets them", () => {
  const lab = useNetLab("egress-scrub", (topo) => ({ NODE_EXTRA_CA_CERTS: topo.caFile }));
  const { topo, made } = lab;

  async function attack(id: string, checks: Record<string, Check>, ca: string): Promise<Record<string, Answer>> {
    const name = `/tmp/attack-${randomBytes(4).toString("hex")}`;
    await putSandboxFile(lab.base, id, "/tmp/attacker.cjs", ATTACKER);
    await putSandboxFile(lab.base, id, `${name}.json`, JSON.stringify({ address: PUBLIC_HTTP, ca, checks }));
    const r = await runCommand(lab.base.replace(/^http/, "ws"), id, {
      cmd: `node /tmp/attacker.cjs ${name}.json`,
      timeout_s: 180,
    });
    if (r.exit?.exit_code !== 0)
      throw new Error(`the attacker in ${id} failed: ${r.stderr || JSON.stringify(r.error)}`);
    return JSON.parse(r.stdout) as Record<string, Answer>;
  }

  it.skipIf(gvisor.missing !== undefined)(
    driverTitle(
      gvisor,
      "a bound host's base64 or compressed echo of the header gives the sandbox nothing of the value",
    ),
    async () => {
      const GH = `ghp_${randomBytes(15).toString("hex")}`;
      expect((await api(lab.base, "PUT", "/secrets/gh", { value: GH, hosts: [NAMES.api] })).status).toBe(201);
      const id = await createSandbox(lab.base, { driver: "gvisor", secrets: ["gh"] });
      made.push(id);
      const ph = (await runCommand(lab.base.replace(/^http/, "ws"), id, { cmd: 'printf %s "$GH"' })).stdout;
      expect(ph).toMatch(/^bothy_ph_/);
      const ca = `${await readFile(join(lab.home, "secrets", "egress-ca.crt"), "utf8")}\n${topo.caPem}`;
      const checks: Record<string, Check> = {};
      // Users of 1, 2 and 3 bytes put the value at each place of a 3-byte group in Basic credentials.
      const auths = {
        bearer: `Bearer ${ph}`,
        token: `token ${ph}`,
        ...Object.fromEntries(
          ["u", "ab", "abc"].map((u) => [`basic-${u}`, `Basic ${Buffer.from(`${u}:${ph}`).toString("base64")}`]),
        ),
      };
      for (const [form, authorization] of Object.entries(auths))
        for (const coding of ["plain", "gzip", "deflate", "br"])
          checks[`${form}/${coding}`] = {
            kind: "https",
            host: NAMES.api,
            path: `/hostile/${coding}`,
            headers: { authorization },
          };
      const r = await attack(id, checks, ca);
      for (const [name, answer] of Object.entries(r)) {
        expect(answer.status, `${name}: ${JSON.stringify(answer)}`).toBe(200);
        expect(answer.headers?.["content-encoding"], name).toBeUndefined();
        expect(recoverable(JSON.stringify(answer), GH, ph), name).toEqual([]);
      }
      // The upstream did get the value: the echo is of the header as the gateway sent it.
      expect(JSON.parse(r["bearer/plain"]?.body ?? "{}")).toMatchObject({ header: `Bearer ${ph}` });
      expect(JSON.stringify(lab.server.logs)).not.toContain(GH);
      expect(await deleteSandbox(lab.base, id)).toBe("deleted");
    },
    600_000,
  );

  it.skipIf(gvisor.missing !== undefined)(
    driverTitle(
      gvisor,
      "a path climbing out of a prefix rule is refused, one staying inside passes, on HTTP and HTTPS",
    ),
    async () => {
      const policy = {
        rules: [{ host: NAMES.api, path: "/repos/me/", action: "allow" as const }],
        default: "deny" as const,
      };
      const id = await createSandbox(lab.base, { driver: "gvisor", policy });
      made.push(id);
      // A rule with a path: this sandbox's HTTPS to the host is terminated with bothy's CA.
      const ca = `${await readFile(join(lab.home, "secrets", "egress-ca.crt"), "utf8")}\n${topo.caPem}`;
      const checks: Record<string, Check> = {};
      for (const kind of ["http", "https"] as const) {
        checks[`${kind}:mine`] = { kind, host: NAMES.api, path: "/repos/me/x" };
        checks[`${kind}:inside`] = { kind, host: NAMES.api, path: "/repos/me/a/../x" };
        checks[`${kind}:dots`] = { kind, host: NAMES.api, path: "/repos/me/../../echo" };
        checks[`${kind}:encoded`] = { kind, host: NAMES.api, path: "/repos/me/%2e%2e/%2e%2e/echo" };
        checks[`${kind}:slash`] = { kind, host: NAMES.api, path: "/repos/me/..%2f..%2fecho" };
        checks[`${kind}:double`] = { kind, host: NAMES.api, path: "/repos/me/%252e%252e/%252e%252e/echo" };
        checks[`${kind}:params`] = { kind, host: NAMES.api, path: "/repos/me/..;/..;/echo" };
      }
      const r = await attack(id, checks, ca);
      const show = JSON.stringify(r);
      for (const kind of ["http", "https"]) {
        expect(r[`${kind}:mine`]?.status, show).toBe(200);
        expect(r[`${kind}:inside`]?.status, show).toBe(200);
        for (const form of ["dots", "encoded", "slash", "double", "params"]) {
          expect(r[`${kind}:${form}`]?.status, `${kind}:${form} ${show}`).toBe(403);
          expect(JSON.parse(r[`${kind}:${form}`]?.body ?? "{}"), show).toMatchObject({
            code: "egress_denied",
            reason: "ambiguous_path",
            rule: "sandbox#0",
          });
        }
      }
      expect(await deleteSandbox(lab.base, id)).toBe("deleted");
    },
    600_000,
  );

  it.skipIf(gvisor.missing !== undefined)(
    driverTitle(gvisor, "an approval of terminated HTTPS shows the body's excerpt, and the body goes out whole"),
    async () => {
      const id = await createSandbox(lab.base, {
        driver: "gvisor",
        policy: { rules: [{ host: NAMES.svcSub, methods: ["POST"], action: "ask" }] },
      });
      made.push(id);
      const ca = `${await readFile(join(lab.home, "secrets", "egress-ca.crt"), "utf8")}\n${topo.caPem}`;
      const body = `ship it ${"x".repeat(10_000)}`;
      const held = attack(id, { post: { kind: "https", host: NAMES.svcSub, path: "/echo", method: "POST", body } }, ca);
      let pending: Array<{ approval_id: string; method: string | null; path: string | null; excerpt: string }> = [];
      const deadline = Date.now() + 120_000;
      while (pending.length === 0 && Date.now() < deadline) {
        pending = (await api(lab.base, "GET", `/approvals?state=pending&sandbox_id=${id}`)).json[
          "approvals"
        ] as typeof pending;
        if (pending.length === 0) await new Promise((r) => setTimeout(r, 200)); // the poll's pace
      }
      expect(pending).toHaveLength(1);
      expect(pending[0]).toMatchObject({ method: "POST", path: "/echo", excerpt: body.slice(0, 8192) });
      const approved = await api(lab.base, "POST", `/approvals/${pending[0]!.approval_id}/approve`, {});
      expect(approved.status, JSON.stringify(approved.json)).toBe(200);
      const r = await held;
      expect(r["post"]?.status, JSON.stringify(r)).toBe(200);
      expect(JSON.parse(r["post"]?.body ?? "{}")).toMatchObject({ method: "POST", body });
      expect(await deleteSandbox(lab.base, id)).toBe("deleted");
    },
    600_000,
  );
});
