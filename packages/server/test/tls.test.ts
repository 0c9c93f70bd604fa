/**
 * TLS served by bothy itself (BOTHY_TLS_CERT/BOTHY_TLS_KEY) with a test CA made by openssl, and
 * the start-up refusals: a non-loopback address without TLS (unless BOTHY_INSECURE_HTTP=1 says a
 * TLS proxy is in front), and BOTHY_AUTH=none anywhere but loopback.
 */
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { request } from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import WebSocket from "ws";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadConfig, startServer } from "../src/index.ts";
import { noLeaks } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

const pexec = promisify(execFile);

/** A CA and a server certificate for 127.0.0.1 signed by it, in `dir`. */
async function testCa(dir: string): Promise<{ ca: string; cert: string; key: string }> {
  const f = (name: string): string => join(dir, name);
  await writeFile(f("san.cnf"), "subjectAltName=IP:127.0.0.1\n");
  await pexec("openssl", [
    "req",
    "-x509",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-days",
    "1",
    "-subj",
    "/CN=bothy test CA",
    "-keyout",
    f("ca.key"),
    "-out",
    f("ca.pem"),
  ]);
  await pexec("openssl", [
    "req",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-subj",
    "/CN=127.0.0.1",
    "-keyout",
    f("server.key"),
    "-out",
    f("server.csr"),
  ]);
  await pexec("openssl", [
    "x509",
    "-req",
    "-in",
    f("server.csr"),
    "-CA",
    f("ca.pem"),
    "-CAkey",
    f("ca.key"),
    "-CAcreateserial",
    "-days",
    "1",
    "-out",
    f("server.pem"),
    "-extfile",
    f("san.cnf"),
  ]);
  return { ca: f("ca.pem"), cert: f("server.pem"), key: f("server.key") };
}

function get(url: string, options: { ca?: Buffer; key?: string }): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(
      url,
      {
        ...(options.ca ? { ca: options.ca } : {}),
        headers: options.key ? { authorization: `Bearer ${options.key}` } : {},
      },
      (res) => {
        let body = "";
        res.on("data", (d: Buffer) => (body += d.toString()));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
      },
    );
    req.on("error", reject);
    req.end();
  });
}

describe("TLS and exposure", () => {
  let dir: string;
  let certs: { ca: string; cert: string; key: string };
  let ts: TestServer | undefined;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "bothy-tls-"));
    certs = await testCa(dir);
  });

  afterAll(async () => {
    if (ts) expect(await ts.stop()).toEqual(noLeaks());
    await rm(dir, { recursive: true, force: true });
  });

  it("serves HTTPS and WSS with its own certificate; a client that does not trust the CA is refused", async () => {
    ts = await startTestServer({ BOTHY_TLS_CERT: certs.cert, BOTHY_TLS_KEY: certs.key });
    expect(ts.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
    const ca = await readFile(certs.ca);
    expect((await get(`${ts.url}/sandboxes`, { ca, key: ts.apiKey })).status).toBe(200);
    expect((await get(`${ts.url}/sandboxes`, { ca })).status).toBe(401);
    await expect(get(`${ts.url}/healthz`, {})).rejects.toThrow(/self.signed|unable to verify|certificate/i);
    // A WebSocket over TLS reaches the route (an unknown sandbox: refused by the route, after TLS).
    const status = await new Promise<number>((resolve, reject) => {
      const ws = new WebSocket(`${ts?.wsUrl ?? ""}/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa/command`, {
        ca,
        headers: { authorization: `Bearer ${ts?.apiKey ?? ""}` },
      });
      ws.on("unexpected-response", (_req, res) => resolve(res.statusCode ?? 0));
      ws.on("open", () => reject(new Error("opened")));
      ws.on("error", (err) => {
        if (!/Unexpected server response/.test(err.message)) reject(err);
      });
    });
    expect(status).toBe(404);
  });

  it("refuses to start on a non-loopback address without TLS, and BOTHY_AUTH=none off loopback", async () => {
    const home = join(dir, "home");
    const base = { ...process.env, BOTHY_HOME: home, BOTHY_PORT: "0" };
    await expect(startServer(loadConfig({ ...base, BOTHY_HOST: "0.0.0.0" }))).rejects.toThrow(
      /BOTHY_TLS_CERT and BOTHY_TLS_KEY.*BOTHY_INSECURE_HTTP=1/,
    );
    await expect(
      startServer(loadConfig({ ...base, BOTHY_HOST: "0.0.0.0", BOTHY_INSECURE_HTTP: "1", BOTHY_AUTH: "none" })),
    ).rejects.toThrow(/BOTHY_AUTH=none is allowed only on loopback/);
    expect(() => loadConfig({ ...base, BOTHY_TLS_CERT: certs.cert })).toThrow(/go together/);
  });
});
