import { existsSync, readFileSync } from "node:fs";
import { request as httpRequest, type IncomingHttpHeaders } from "node:http";
import { chromium, type Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { Sandbox } from "@bothy/sdk";
import { ANONYMOUS, testAdminKey } from "../../../test/auth.ts";
import { startBackgroundCommand } from "./helpers/background.ts";
import { createSandbox, pollUntil, putSandboxFile, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useServerWithSandbox } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

/**
 * Port pages seen from an attacker's side: the code of sandbox A serves a page that a viewer
 * opens, and that page goes after sandbox B's port, which the same viewer holds a link to. The
 * proxy's headers are checked directly, and in the host's Chromium, which proves what a real
 * browser does with them (an opaque origin, which cookies it sends where).
 */
const SERVER = readFileSync(new URL("./fixtures/header-log-server.mjs", import.meta.url), "utf8");
const PORT = 8000;
const DOMAIN = "preview.test";
const HOST_CHROMIUM = "/usr/bin/chromium";
const gvisor = testDrivers().find((d) => d.name === "gvisor") ?? {
  name: "gvisor" as const,
  missing: "gvisor in BOTHY_TEST_DRIVERS",
};

type Answer = { status: number; headers: IncomingHttpHeaders; body: string };

/** A request with a Host of our choosing and no API key unless `headers` names one. */
function send(
  base: string,
  method: string,
  host: string | undefined,
  path: string,
  headers: Record<string, string> = {},
): Promise<Answer> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        hostname,
        port,
        method,
        path,
        headers: { ...ANONYMOUS, ...headers, ...(host ? { host: `${host}:${port}` } : {}) },
      },
      (res) => {
        let body = "";
        res.on("data", (c: Buffer) => (body += c.toString()));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(method === "POST" ? "x" : undefined);
  });
}

/** A WebSocket handshake with these headers: the echo it got back, or the refusal's status and body. */
function openWs(
  url: string,
  headers: Record<string, string>,
): Promise<{ echoed?: string; status?: number; body?: string; setCookie?: string[] }> {
  return new Promise((resolve, reject) => {
    const { origin, ...rest } = headers;
    const ws = new WebSocket(url, { headers: { ...ANONYMOUS, ...rest }, ...(origin === undefined ? {} : { origin }) });
    let setCookie: string[] | undefined;
    ws.on("upgrade", (res) => (setCookie = res.headers["set-cookie"]));
    ws.on("open", () => ws.send("hi"));
    ws.on("message", (data) => {
      resolve({ echoed: data.toString(), ...(setCookie ? { setCookie } : {}) });
      ws.close();
    });
    ws.on("unexpected-response", (_req, res) => {
      let body = "";
      res.on("data", (c: Buffer) => (body += c.toString()));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    ws.on("error", reject);
  });
}

/** What reached the header-logging server on PORT inside a sandbox, from its own log file. */
async function guestSaw(
  ts: TestServer,
  id: string,
): Promise<Array<{ method: string; url: string; ws: boolean; headers: Record<string, string> }>> {
  const r = await runCommand(ts.wsUrl, id, { cmd: `cat /tmp/headers-${PORT}.log 2>/dev/null || true` });
  return r.stdout
    .split("\n")
    .filter(Boolean)
    .map((line) => JSON.parse(line) as { method: string; url: string; ws: boolean; headers: Record<string, string> });
}

async function startServer(ts: TestServer, id: string, name: string): Promise<void> {
  await putSandboxFile(ts.url, id, "/workspace/header-log-server.mjs", SERVER);
  await startBackgroundCommand(
    ts.url,
    id,
    `node /workspace/header-log-server.mjs ${PORT} ${name} ${DOMAIN} > /tmp/hls.log 2>&1`,
  );
  await pollUntil(
    `port ${PORT} listening in ${id}`,
    async () => {
      const res = await fetch(`${ts.url}/sandboxes/${id}/ports`);
      return ((await res.json()) as { ports: Array<{ port: number }> }).ports.some((p) => p.port === PORT);
    },
    60_000,
  );
}

/** A port link's URLs and token. */
async function link(ts: TestServer, id: string): Promise<{ url: string; preview: string; token: string }> {
  const made = await (await Sandbox.connect(id, { baseUrl: ts.url })).ports.link(PORT, { ttlS: 600 });
  return { url: made.url, preview: made.preview_url!, token: new URL(made.url).searchParams.get("token")! };
}

describe.skipIf(gvisor.missing !== undefined)(driverTitle(gvisor, "port pages stay on an origin of their own"), () => {
  let ts: TestServer;
  let a: string;
  let b: string;
  useServerWithSandbox(
    "gvisor",
    (server, sandbox) => {
      ts = server;
      a = sandbox;
    },
    { BOTHY_PREVIEW_DOMAIN: DOMAIN },
  );
  beforeAll(async () => {
    b = await createSandbox(ts.url);
    await Promise.all([startServer(ts, a, "A"), startServer(ts, b, "B")]);
  });
  const hostOf = (id: string): string => `${PORT}-${id}.${DOMAIN}`;
  /** The Host a browser sends to a preview host name on the test server's port. */
  const hostHeader = (id: string): string => `${hostOf(id)}:${new URL(ts.url).port}`;
  const originOf = (id: string): string => `http://${hostHeader(id)}`;

  it("the app inside sees no API key, E2B token, link token or bothy cookie, by any way in", async () => {
    const { token } = await link(ts, a);
    // The sandbox's E2B tokens, as E2B's connect hands them to the SDK.
    const connected = await fetch(`${ts.url}/e2b/v2/sandboxes/${a}/connect`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    expect(connected.status).toBe(200);
    const { envdAccessToken: envd, trafficAccessToken: traffic } = (await connected.json()) as {
      envdAccessToken: string;
      trafficAccessToken: string;
    };
    const key = testAdminKey();
    const path = `/sandboxes/${a}/ports/${PORT}/secret`;
    const e2b = { "x-access-token": envd, "e2b-traffic-access-token": traffic };
    const cookies = `app=1; bothy_link=${token}; __Host-bothy_session=s`;
    // An API key as Bearer and as X-API-Key, with E2B's token headers and bothy's cookies beside it.
    expect(
      (await send(ts.url, "GET", undefined, path, { authorization: `Bearer ${key}`, ...e2b, cookie: cookies })).status,
    ).toBe(200);
    expect((await send(ts.url, "GET", undefined, path, { "x-api-key": key, ...e2b })).status).toBe(200);
    // A port link: its cookie, its ?token= on a POST, the preview host.
    expect((await send(ts.url, "GET", undefined, path, { cookie: cookies })).status).toBe(200);
    expect((await send(ts.url, "POST", undefined, `/sandboxes/${a}/ports/${PORT}/echo?token=${token}`)).status).toBe(
      200,
    );
    expect((await send(ts.url, "GET", hostOf(a), "/secret", { cookie: cookies })).status).toBe(200);
    // E2B's port traffic, as @e2b/code-interpreter sends it: both of the sandbox's tokens.
    const viaE2b = await send(ts.url, "GET", undefined, "/e2b/envd/secret", {
      "e2b-sandbox-id": a,
      "e2b-sandbox-port": String(PORT),
      ...e2b,
    });
    expect(viaE2b.status).toBe(200);
    // A WebSocket by key and by the link's cookie.
    expect(
      (
        await openWs(`${ts.wsUrl}/sandboxes/${a}/ports/${PORT}/ws`, {
          authorization: `Bearer ${key}`,
          ...e2b,
          cookie: cookies,
        })
      ).echoed,
    ).toBe("hi");
    expect((await openWs(`${ts.wsUrl}/ws`, { host: hostHeader(a), cookie: cookies })).echoed).toBe("hi");

    const seen = await guestSaw(ts, a);
    expect(seen.length).toBeGreaterThanOrEqual(8);
    const all = JSON.stringify(seen);
    for (const secret of [key, token, token.split(".")[1]!, envd, traffic]) expect(all).not.toContain(secret);
    expect(all).not.toMatch(/bothy_/i);
    expect(all).not.toMatch(/access-token/i);
    // The app's own cookie still reaches it.
    expect(seen.filter((r) => r.headers["cookie"] === "app=1").length).toBeGreaterThanOrEqual(4);
  });

  it("path form: a page runs as an opaque origin (CSP sandbox), unsniffed, and sets no cookie on the API's origin", async () => {
    const page = await send(ts.url, "GET", undefined, `/sandboxes/${a}/ports/${PORT}/`, {
      authorization: `Bearer ${testAdminKey()}`,
    });
    expect(page.status).toBe(200);
    const csp = [page.headers["content-security-policy"] ?? []].flat().join(", ");
    expect(csp).toMatch(/^sandbox allow-scripts /);
    expect(csp).not.toContain("allow-same-origin");
    expect(page.headers["x-content-type-options"]).toBe("nosniff");
    const cookies = await send(ts.url, "GET", undefined, `/sandboxes/${a}/ports/${PORT}/set-cookie`, {
      authorization: `Bearer ${testAdminKey()}`,
    });
    expect(cookies.status).toBe(200);
    expect(cookies.headers["set-cookie"]).toBeUndefined();
    expect(cookies.headers["clear-site-data"]).toBeUndefined();
    const ws = await openWs(`${ts.wsUrl}/sandboxes/${a}/ports/${PORT}/ws`, {
      authorization: `Bearer ${testAdminKey()}`,
    });
    expect(ws).toEqual({ echoed: "hi" });
    // A path-form page's own requests come from origin `null`: on the cookie alone they do not act.
    const { token } = await link(ts, a);
    const refused = await openWs(`${ts.wsUrl}/sandboxes/${a}/ports/${PORT}/ws`, {
      cookie: `bothy_link=${token}`,
      origin: "null",
    });
    expect(refused.status).toBe(403);
    expect(JSON.parse(refused.body!)).toMatchObject({ code: "origin_refused", status: 403 });
  });

  it("preview form: a request from sandbox A's origin carrying B's link cookie reaches nothing of B", async () => {
    const { token } = await link(ts, b);
    // The link leaves a host-only cookie on B's own host name.
    const landing = await send(ts.url, "GET", hostOf(b), `/?token=${token}`);
    expect(landing.status).toBe(303);
    const cookie = String(landing.headers["set-cookie"]);
    expect(cookie).toMatch(/^bothy_link=[\w.-]+; Path=\/;/);
    expect(cookie).not.toMatch(/domain/i);
    const jar = { cookie: `bothy_link=${token}` };
    const before = (await guestSaw(ts, b)).length;

    // From A's origin: the WebSocket, a write and a read are all refused before they reach B.
    const ws = await openWs(`${ts.wsUrl}/ws`, { host: hostHeader(b), ...jar, origin: originOf(a) });
    expect(ws.status).toBe(403);
    expect(JSON.parse(ws.body!)).toMatchObject({ code: "origin_refused" });
    for (const [method, path] of [
      ["POST", "/echo"],
      ["GET", "/secret"],
    ] as const) {
      const res = await send(ts.url, method, hostOf(b), path, { ...jar, origin: originOf(a) });
      expect(res.status, `${method} ${path}`).toBe(403);
      expect(res.headers["content-type"]).toContain("application/problem+json");
      expect(JSON.parse(res.body)).toMatchObject({ code: "origin_refused" });
    }
    expect((await send(ts.url, "POST", hostOf(b), "/echo", { ...jar, origin: "null" })).status).toBe(403);
    expect((await guestSaw(ts, b)).length).toBe(before);

    // B's own origin, and clients that send no Origin, are served.
    expect(await openWs(`${ts.wsUrl}/ws`, { host: hostHeader(b), ...jar, origin: originOf(b) })).toEqual({
      echoed: "hi",
      setCookie: ["ws=1; Path=/"],
    });
    expect((await send(ts.url, "POST", hostOf(b), "/echo", { ...jar, origin: originOf(b) })).body).toBe("posted");
    expect((await send(ts.url, "GET", hostOf(b), "/secret", jar)).body).toBe("secret of B");
    // An API key is no ambient credential: its holder may send any Origin.
    expect(
      (
        await send(ts.url, "POST", hostOf(b), "/echo", {
          authorization: `Bearer ${testAdminKey()}`,
          origin: originOf(a),
        })
      ).body,
    ).toBe("posted");

    // B's app cannot set a cookie for every preview host, nor one of bothy's.
    const set = await send(ts.url, "GET", hostOf(b), "/set-cookie", jar);
    expect(set.headers["set-cookie"]).toEqual(["tossed=1; Path=/", "own=1; Path=/"]);
    expect(set.headers["clear-site-data"]).toBeUndefined();
  });

  describe.skipIf(!existsSync(HOST_CHROMIUM))("in the host's Chromium", () => {
    let browser: Browser | undefined;
    afterAll(async () => {
      await browser?.close();
    });

    it("a page of sandbox A, opened by a viewer who holds B's links, reads nothing of B by path or by host", async () => {
      browser = await chromium.launch({
        executablePath: HOST_CHROMIUM,
        args: [
          "--no-sandbox",
          "--disable-gpu",
          "--disable-background-networking",
          "--disable-component-update",
          `--host-resolver-rules=MAP *.${DOMAIN} 127.0.0.1`,
        ],
      });
      const page = await browser.newPage();
      const linkA = await link(ts, a);
      const linkB = await link(ts, b);
      // The viewer has opened B's port both ways: the browser holds both of B's cookies.
      for (const url of [linkB.url, linkB.preview]) {
        await page.goto(url);
        await page.waitForFunction("'result' in window", undefined, { timeout: 30_000 });
      }
      const attack = async (url: string, target: string): Promise<Record<string, string>> => {
        await page.goto(`${url}&target=${encodeURIComponent(target)}`);
        await page.waitForFunction("'result' in window", undefined, { timeout: 30_000 });
        return page.evaluate<Record<string, string>>("window.result");
      };
      const before = (await guestSaw(ts, b)).length;

      // On the API's origin, A's page is an opaque origin: no cookie of B goes with its requests.
      const byPath = await attack(linkA.url, `${ts.url}/sandboxes/${b}/ports/${PORT}/`);
      expect(byPath).toMatchObject({ origin: "null", cookie: "throws", read: "blocked", ws: "refused" });
      // On its own host, A's page gets B's cookie sent along (same site), and the Origin refuses it.
      const byHost = await attack(linkA.preview, `${originOf(b)}/`);
      expect(byHost).toMatchObject({ origin: originOf(a), read: "blocked", ws: "refused" });
      // Nothing from either page reached B's app.
      expect((await guestSaw(ts, b)).slice(before)).toEqual([]);
    });
  });
});
