/**
 * Request smuggling through the gateway from inside a real sandbox in the network lab
 * (helpers/net-topology.ts): the sandbox's code holds a placeholder of a secret bound to
 * `api.bothy.test` and writes raw bytes (and HTTP/2 frames) to that host through the terminator;
 * the `wan` fixture (a keep-alive Node server that accepts pipelined requests) logs every request
 * it parses. It must parse only requests the gateway judged (each one an `egress.allowed` in the
 * audit), and the secret's value must reach no request body.
 */
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { api, createSandbox, deleteSandbox, putSandboxFile, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useNetLab } from "./helpers/net-lab.ts";
import { NAMES, PUBLIC_HTTP } from "./helpers/net-topology.ts";

const root = process.getuid?.() === 0;
const drivers = testDrivers();

/**
 * The sandbox's code. `chunked`: a GET whose chunked body is a POST with a Content-Length reaching
 * into the next request, then that next request (the placeholder in its Authorization) on the same
 * TLS connection. `h2`: the same hidden request as HTTP/2 DATA on a GET, then a GET on the same
 * session. `upgrade`: a WebSocket upgrade to the bound host. `plainFirst`, `plainNext`: the chunked
 * GET over plain HTTP, then a request on another connection. Prints what came back.
 */
const ATTACKER = String.raw`
const tls = require("tls"), net = require("net"), http2 = require("http2"), fs = require("fs");
const s = JSON.parse(fs.readFileSync("/tmp/smuggle.json", "utf8"));
const statuses = (t) => [...t.matchAll(/HTTP\/1\.1 (\d{3})/g)].length;
const hidden = "POST /smuggled HTTP/1.1\r\nHost: " + s.host + "\r\nContent-Length: 80\r\n\r\n";
const chunk = hidden.length.toString(16) + "\r\n" + hidden + "\r\n0\r\n\r\n";
function raw(steps, secure = true) {
  return new Promise((resolve) => {
    let text = "", closed = false, wake = () => {};
    const c = secure
      ? tls.connect({ host: s.address, port: 443, servername: s.host, ca: s.ca, ALPNProtocols: ["http/1.1"] })
      : net.connect({ host: s.address, port: 80 });
    c.on("data", (d) => { text += d.toString("latin1"); wake(); });
    c.on("close", () => { closed = true; wake(); });
    c.on("error", (e) => { text += " error:" + e.code; });
    c.once(secure ? "secureConnect" : "connect", async () => {
      for (const [bytes, answers] of steps) {
        c.write(bytes);
        const deadline = Date.now() + 15000;
        while (statuses(text) < answers && !closed && Date.now() < deadline)
          await new Promise((r) => { wake = r; setTimeout(r, 250); });
      }
      c.destroy();
      resolve(text);
    });
  });
}
async function h2() {
  const session = http2.connect("https://" + s.address, { servername: s.host, ca: s.ca });
  const ask = (headers, body) => new Promise((resolve) => {
    const st = session.request(headers, { endStream: body === undefined });
    let text = "";
    st.on("response", (h) => { text = h[":status"] + " "; });
    st.on("data", (d) => (text += d));
    st.on("end", () => resolve(text));
    st.on("error", (e) => resolve("error:" + e.code));
    if (body !== undefined) st.end(body);
  });
  const first = await ask({ ":method": "GET", ":path": "/echo/h2-first" }, hidden);
  const next = await ask({ ":method": "GET", ":path": "/echo/h2-next", authorization: "Bearer " + s.ph });
  session.close();
  return { first, next };
}
(async () => {
  const victim = "GET /echo/next HTTP/1.1\r\nHost: " + s.host + "\r\nAuthorization: Bearer " + s.ph + "\r\n\r\n";
  const chunked = await raw([
    ["GET /echo/first HTTP/1.1\r\nHost: " + s.host + "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk, 1],
    [victim, 2],
  ]);
  const h = await h2();
  // Plain HTTP: the hidden request, then another connection's request (the proxy pools upstream connections).
  const plainFirst = await raw([["GET /echo/plain-first HTTP/1.1\r\nHost: " + s.host + "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk, 1]], false);
  const plainNext = await raw([["GET /echo/plain-next HTTP/1.1\r\nHost: " + s.host + "\r\nX-Victim: yes\r\n\r\n", 1]], false);
  const upgrade = await raw([
    ["GET /ws HTTP/1.1\r\nHost: " + s.host + "\r\nAuthorization: Bearer " + s.ph +
      "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\nping", 1],
  ]);
  console.log(JSON.stringify({ chunked, h2: h, upgrade, plainFirst, plainNext }));
})();
`;

const statuses = (text: string): number[] => [...text.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => Number(m[1]));

describe.skipIf(!root)("egress gateway request framing", () => {
  const lab = useNetLab("smuggle", (topo) => ({ NODE_EXTRA_CA_CERTS: topo.caFile }), { logWanRequests: true });
  const { topo, made } = lab;

  describe.each(drivers)("$name", (d) => {
    it.skipIf(d.missing !== undefined)(
      driverTitle(
        d,
        "a sandbox's chunked GET (HTTPS and HTTP), HTTP/2 DATA on a GET and upgrade to a bound host reach no unjudged request",
      ),
      async () => {
        const GH = `ghp_${randomBytes(12).toString("hex")}`;
        // A secret of its own per driver: each test sees only its own value.
        const name = `sm_${d.name}`;
        expect((await api(lab.base, "PUT", `/secrets/${name}`, { value: GH, hosts: [NAMES.api] })).status).toBe(201);
        const id = await createSandbox(lab.base, { driver: d.name, secrets: [name] });
        made.push(id);
        const ws = lab.base.replace(/^http/, "ws");
        const ph = (await runCommand(ws, id, { cmd: `printf %s "$${name.toUpperCase()}"` })).stdout;
        expect(ph).toMatch(/^bothy_ph_/);
        const ca = `${await readFile(join(lab.home, "secrets", "egress-ca.crt"), "utf8")}\n${topo.caPem}`;
        await putSandboxFile(lab.base, id, "/tmp/smuggle.cjs", ATTACKER);
        const spec = { address: PUBLIC_HTTP, host: NAMES.api, ca, ph };
        await putSandboxFile(lab.base, id, "/tmp/smuggle.json", JSON.stringify(spec));
        const before = (await topo.wanRequests()).length;
        const run = await runCommand(ws, id, { cmd: "node /tmp/smuggle.cjs", timeout_s: 120 });
        expect(run.exit?.exit_code, run.stderr).toBe(0);
        const out = JSON.parse(run.stdout) as {
          chunked: string;
          h2: { first: string; next: string };
          upgrade: string;
          plainFirst: string;
          plainNext: string;
        };

        // What the upstream parsed: only judged requests, the value in no body.
        const parsed = (await topo.wanRequests()).slice(before);
        expect(parsed.map((p) => p.url)).not.toContain("/smuggled");
        expect(parsed.filter((p) => p.body.includes(GH))).toEqual([]);
        const audit = (await api(lab.base, "GET", `/sandboxes/${id}/audit?type=egress.allowed`)).json[
          "events"
        ] as Array<{
          data: { method: string | null; path: string | null };
        }>;
        const judged = audit.map((e) => `${e.data.method} ${e.data.path}`);
        for (const p of parsed)
          expect(judged, `the upstream parsed ${p.method} ${p.url}`).toContain(`${p.method} ${p.url}`);
        expect(parsed.map((p) => p.url).sort()).toEqual(["/echo/h2-next", "/echo/next", "/echo/plain-next"]);

        // What the sandbox got: the refusals as problems, its later requests answered.
        expect(statuses(out.chunked), out.chunked).toEqual([400, 200]);
        expect(out.chunked).toContain('"code":"malformed_request"');
        expect(out.h2.first).toMatch(/^400 .*"code":"malformed_request"/);
        expect(out.h2.next).toMatch(/^200 /);
        expect(statuses(out.upgrade), out.upgrade).toEqual([403]);
        expect(out.upgrade).toContain('"reason":"upgrade_on_bound_host"');
        expect(statuses(out.plainFirst), out.plainFirst).toEqual([400]);
        expect(statuses(out.plainNext), out.plainNext).toEqual([200]);
        expect(JSON.stringify(out)).not.toContain(GH);
        expect(await deleteSandbox(lab.base, id)).toBe("deleted");
      },
      600_000,
    );
  });
});
