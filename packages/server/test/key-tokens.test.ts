/**
 * What a token made for a key may do, from the side of whoever holds it (gVisor, real runsc and
 * SQLite): a read-only key gets no envd token; an envd, traffic or signed-file token, and a link,
 * stop working once the key that asked for them is revoked or expires; an expiring key makes no
 * key that outlives it; link cookies are Secure behind a TLS proxy; and a server without keys
 * answers no web page that reached it through a name of its own (DNS rebinding).
 */
import { get as httpGet } from "node:http";
import { AuthenticationError, Sandbox } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { ANONYMOUS } from "../../../test/auth.ts";
import { useE2bEnv } from "./helpers/e2b-env.ts";
import { noLeaks } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

interface Answer {
  status: number;
  json: Record<string, unknown>;
  text: string;
}

async function call(
  ts: TestServer,
  key: string | undefined,
  method: string,
  path: string,
  body?: unknown,
  extra: Record<string, string> = {},
): Promise<Answer> {
  const res = await fetch(`${ts.url}${path}`, {
    method,
    redirect: "manual",
    headers: {
      ...(key === undefined ? ANONYMOUS : { authorization: `Bearer ${key}` }),
      ...(body === undefined ? {} : { "content-type": "application/json" }),
      ...extra,
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let json: Record<string, unknown> = {};
  try {
    json = text ? (JSON.parse(text) as Record<string, unknown>) : {};
  } catch {
    json = {};
  }
  return { status: res.status, json, text };
}

/** A GET to a loopback server with a Host header of our choosing (a page's rebound name). */
function getWithHost(
  url: string,
  host: string,
  path: string,
): Promise<{ status: number; body: string; type: string | undefined }> {
  return new Promise((resolve, reject) => {
    const req = httpGet(`${url}${path}`, { headers: { host } }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (d: string) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body, type: res.headers["content-type"] }));
    });
    req.on("error", reject);
  });
}

/** Polls until `check` holds, failing after `ms`. */
async function until(check: () => boolean, ms: number, what: string): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`gave up waiting: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe("tokens end with their key (gVisor, behind a TLS proxy)", () => {
  let ts: TestServer;
  let admin: string;
  /** A sandbox the admin key made; others reach it with keys of their own. */
  let sandboxId = "";
  let restoreE2bEnv = (): void => undefined;

  async function mint(body: Record<string, unknown>, by = admin): Promise<{ key: string; key_id: string }> {
    const res = await call(ts, by, "POST", "/keys", body);
    expect(res.status, res.text).toBe(201);
    return res.json as { key: string; key_id: string };
  }

  const revoke = async (keyId: string): Promise<void> => {
    expect((await call(ts, admin, "DELETE", `/keys/${keyId}`)).status).toBe(200);
  };

  /** What E2B's control plane answers for the sandbox to this key. */
  const e2bInfo = (key: string): Promise<Answer> =>
    call(ts, undefined, "GET", `/e2b/sandboxes/${sandboxId}`, undefined, { "x-api-key": key });

  /** An envd call as the SDK makes it, with only the sandbox's id and this token. */
  const envdHealth = async (token: string): Promise<number> =>
    (
      await fetch(`${ts.url}/e2b/envd/health`, {
        headers: { "e2b-sandbox-id": sandboxId, "x-access-token": token },
      })
    ).status;

  beforeAll(async () => {
    // Plain HTTP on loopback, as behind a TLS proxy (BOTHY_INSECURE_HTTP=1): its clients speak HTTPS.
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor", BOTHY_INSECURE_HTTP: "1" });
    admin = ts.apiKey;
    restoreE2bEnv = useE2bEnv(ts.url);
    const made = await call(ts, admin, "POST", "/sandboxes", { template: "seed", memory_mib: 256 });
    expect(made.status, made.text).toBe(201);
    sandboxId = String(made.json["sandbox_id"]);
  });

  afterAll(async () => {
    restoreE2bEnv();
    if (sandboxId) await call(ts, admin, "DELETE", `/sandboxes/${sandboxId}`);
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  it("gives a sandboxes:read key no envd token, and a key that may run commands one that works", async () => {
    const reader = await mint({ scopes: ["sandboxes:read"] });
    const read = await e2bInfo(reader.key);
    expect(read.status, read.text).toBe(200);
    expect(read.json["sandboxID"]).toBe(sandboxId);
    expect(read.json).not.toHaveProperty("envdAccessToken");
    // Nor does it get one by connecting: that needs sandboxes:write.
    const connect = await call(
      ts,
      undefined,
      "POST",
      `/e2b/v2/sandboxes/${sandboxId}/connect`,
      {},
      {
        "x-api-key": reader.key,
      },
    );
    expect(connect.status).toBe(403);
    expect(connect.text).not.toContain("envdAccessToken");
    // The control: a writer's GET carries a token that envd takes.
    const writer = await mint({ scopes: ["sandboxes:read", "sandboxes:write"] });
    const token = String((await e2bInfo(writer.key)).json["envdAccessToken"]);
    expect(await envdHealth(token)).toBe(204);
  });

  it("refuses an envd token, its traffic token and its signed file URLs once the key that got them is revoked", async () => {
    const doomed = await mint({ scopes: ["sandboxes:read", "sandboxes:write"] });
    const sbx = await Sandbox.connect(sandboxId, { apiKey: doomed.key });
    expect((await sbx.commands.run("echo before")).stdout).toBe("before\n");
    await sbx.files.write("/tmp/signed.txt", "signed");
    const download = await sbx.downloadUrl("/tmp/signed.txt");
    expect(await (await fetch(download)).text()).toBe("signed");
    const viaPort = () =>
      fetch(`${ts.url}/e2b/envd/`, {
        headers: {
          "e2b-sandbox-id": sandboxId,
          "e2b-sandbox-port": "8000",
          "e2b-traffic-access-token": sbx.trafficAccessToken ?? "",
        },
      });
    // Nothing listens on 8000: the token is let in (502 from the proxy), not refused.
    expect((await viaPort()).status).toBe(502);

    await revoke(doomed.key_id);
    await expect(sbx.commands.run("echo after")).rejects.toBeInstanceOf(AuthenticationError);
    await expect(sbx.files.read("/tmp/signed.txt")).rejects.toBeInstanceOf(AuthenticationError);
    expect((await fetch(download)).status).toBe(401);
    expect((await viaPort()).status).toBe(401);
    // The admin key's own token still works: the sandbox is fine, the revoked key's tokens are not.
    const adminToken = String((await e2bInfo(admin)).json["envdAccessToken"]);
    expect(await envdHealth(adminToken)).toBe(204);
  });

  it("refuses an envd token once the key that got it has expired", async () => {
    const expiring = await mint({ scopes: ["sandboxes:write"], expires_in_s: 20 });
    const connect = await call(
      ts,
      undefined,
      "POST",
      `/e2b/v2/sandboxes/${sandboxId}/connect`,
      {},
      {
        "x-api-key": expiring.key,
      },
    );
    expect(connect.status, connect.text).toBe(200);
    const token = String(connect.json["envdAccessToken"]);
    const expiresAt = Date.parse(
      String(
        ((await call(ts, admin, "GET", "/keys")).json["keys"] as Array<Record<string, unknown>>).find(
          (k) => k["key_id"] === expiring.key_id,
        )?.["expires_at"],
      ),
    );
    await until(() => Date.now() > expiresAt, 30_000, "the key's expiry");
    expect(await envdHealth(token)).toBe(401);
  });

  it("ends a port link, by URL or by its cookie, once the key that made it is revoked", async () => {
    const maker = await mint({ scopes: ["sandboxes:read", "sandboxes:write"] });
    const link = await call(ts, maker.key, "POST", `/sandboxes/${sandboxId}/port-links/8000`, {});
    expect(link.status, link.text).toBe(200);
    const url = new URL(String(link.json["url"]));
    const token = String(url.searchParams.get("token"));
    const open = (headers: Record<string, string> = {}, path = `${url.pathname}${url.search}`) =>
      fetch(`${ts.url}${path}`, { redirect: "manual", headers: { ...ANONYMOUS, ...headers } });
    expect((await open()).status).toBe(303);
    const byCookie = () => open({ cookie: `bothy_link=${token}` }, url.pathname);
    // Nothing listens on 8000: the cookie lets the request in (502), it is not refused.
    expect((await byCookie()).status).toBe(502);

    await revoke(maker.key_id);
    expect((await open()).status).toBe(401);
    expect((await byCookie()).status).toBe(401);
  });

  it("sets the link cookie Secure behind a TLS proxy (BOTHY_INSECURE_HTTP=1), where the browser speaks HTTPS", async () => {
    const link = await call(ts, admin, "POST", `/sandboxes/${sandboxId}/port-links/8000`, {});
    expect(link.status, link.text).toBe(200);
    const url = new URL(String(link.json["url"]));
    const landing = await fetch(`${ts.url}${url.pathname}${url.search}`, { redirect: "manual", headers: ANONYMOUS });
    expect(landing.status).toBe(303);
    expect(landing.headers.get("set-cookie")).toMatch(/^bothy_link=[^;]+;.*; HttpOnly; SameSite=Lax; Secure$/);
  });

  it("lets an expiring key make keys only within its own life", async () => {
    const manager = await mint({ scopes: ["keys:manage", "sandboxes:read"], expires_in_s: 3600 });
    const forever = await call(ts, manager.key, "POST", "/keys", { scopes: ["sandboxes:read"] });
    expect([forever.status, forever.json["code"], forever.json["max_expires_in_s"]]).toEqual([
      400,
      "invalid_request",
      expect.any(Number),
    ]);
    expect(String(forever.json["detail"])).toMatch(/expires_in_s of at most \d+/);
    const later = await call(ts, manager.key, "POST", "/keys", { scopes: ["sandboxes:read"], expires_in_s: 7200 });
    expect([later.status, later.json["code"]]).toEqual([400, "invalid_request"]);
    const within = await call(ts, manager.key, "POST", "/keys", { scopes: ["sandboxes:read"], expires_in_s: 1800 });
    expect(within.status, within.text).toBe(201);
    // A key that does not expire is not bound.
    const unbound = await mint({ scopes: ["keys:manage", "sandboxes:read"] });
    expect((await call(ts, unbound.key, "POST", "/keys", { scopes: ["sandboxes:read"] })).status).toBe(201);
  });
});

describe("BOTHY_AUTH=none answers only to its own names (DNS rebinding)", () => {
  let ts: TestServer;
  const PREVIEW = "preview.test";

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_AUTH: "none", BOTHY_PREVIEW_DOMAIN: PREVIEW });
  });

  afterAll(async () => {
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  it("refuses a page's request that names another host, with problem+json host_not_allowed", async () => {
    const port = new URL(ts.url).port;
    for (const host of ["evil.example", `evil.example:${port}`, "127.0.0.1.evil.example", "localhost.evil.example"]) {
      const res = await getWithHost(ts.url, host, "/sandboxes");
      expect([host, res.status, res.type]).toEqual([host, 403, "application/problem+json; charset=utf-8"]);
      const problem = JSON.parse(res.body) as Record<string, unknown>;
      expect(problem["code"]).toBe("host_not_allowed");
      expect(String(problem["detail"])).toContain("BOTHY_AUTH=none");
    }
    // A WebSocket from such a page is refused before it opens.
    const status = await new Promise<number>((resolve, reject) => {
      const ws = new WebSocket(`${ts.wsUrl}/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa/command`, {
        headers: { host: "evil.example" },
      });
      ws.on("unexpected-response", (_req, res) => resolve(res.statusCode ?? 0));
      ws.on("open", () => {
        ws.close();
        resolve(101);
      });
      ws.on("error", (err) => {
        if (!/Unexpected server response/.test(err.message)) reject(err);
      });
    });
    expect(status).toBe(403);
  });

  it("answers loopback names and addresses, and the preview domain", async () => {
    const port = new URL(ts.url).port;
    for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, "localhost", `[::1]:${port}`, "app.localhost"])
      expect([host, (await getWithHost(ts.url, host, "/sandboxes")).status]).toEqual([host, 200]);
    // A preview name reaches the port proxy (no such sandbox here), not the Host refusal.
    const preview = await getWithHost(ts.url, `8000-sbx_aaaaaaaaaaaaaaaaaaaa.${PREVIEW}:${port}`, "/");
    expect(preview.status).not.toBe(403);
  });
});
