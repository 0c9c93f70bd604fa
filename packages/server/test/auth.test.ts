/**
 * API keys, scopes and tenants on a real server (gVisor sandboxes): the 401 battery, the scope
 * battery and the cross-tenant battery are driven by the served /openapi.json, so a route added
 * without its checks fails here; revocation ends open sockets; quotas refuse without leaving
 * anything half-made; no raw key is ever found in the server's home, log, events or answers.
 */
import { execFile } from "node:child_process";
import { readFile, stat } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import WebSocket from "ws";
import { Sandbox } from "@bothy/sdk";
import { API_SCOPES } from "@bothy/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ANONYMOUS } from "../../../test/auth.ts";
import { homeFilesHolding, noLeaks } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

interface Answer {
  status: number;
  headers: Headers;
  text: string;
  json: Record<string, unknown>;
}

/** Every answer body this file received, for the check that none carries a key. */
const bodies: string[] = [];

async function call(
  base: string,
  key: string | undefined,
  method: string,
  path: string,
  body?: unknown,
  extra: Record<string, string> = {},
): Promise<Answer> {
  const headers: Record<string, string> = {
    ...(key === undefined ? ANONYMOUS : { authorization: `Bearer ${key}` }),
    ...(body === undefined ? {} : { "content-type": "application/json" }),
    ...extra,
  };
  const res = await fetch(`${base}${path}`, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  // An event stream or proxied body is not read to its end.
  const type = res.headers.get("content-type") ?? "";
  const text = type.startsWith("text/event-stream") ? (await res.body?.cancel(), "") : await res.text();
  // A made key is shown once, in the answer to its create, by design.
  if (!(method === "POST" && path === "/keys" && res.status === 201)) bodies.push(text);
  let json: Record<string, unknown> = {};
  try {
    json = text ? (JSON.parse(text) as Record<string, unknown>) : {};
  } catch {
    json = {};
  }
  return { status: res.status, headers: res.headers, text, json };
}

/** The status of a WebSocket upgrade: refused (its HTTP status and body) or opened (101). */
function upgrade(url: string, key: string): Promise<{ status: number; body: string; ws?: WebSocket }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { headers: { authorization: `Bearer ${key}` } });
    ws.on("unexpected-response", (_req, res) => {
      let body = "";
      res.on("data", (d: Buffer) => (body += d.toString()));
      res.on("end", () => {
        bodies.push(body);
        resolve({ status: res.statusCode ?? 0, body });
      });
    });
    ws.on("open", () => resolve({ status: 101, body: "", ws }));
    ws.on("error", (err) => {
      if (!/Unexpected server response/.test(err.message)) reject(err);
    });
  });
}

interface Operation {
  method: string;
  path: string;
  scope: string;
  websocket: boolean;
}

function operations(doc: Record<string, unknown>): Operation[] {
  const out: Operation[] = [];
  for (const [path, ops] of Object.entries(doc["paths"] as Record<string, Record<string, Record<string, unknown>>>))
    for (const [method, op] of Object.entries(ops))
      out.push({ method: method.toUpperCase(), path, scope: String(op["x-scope"]), websocket: "x-websocket" in op });
  return out;
}

const BOTHY = fileURLToPath(new URL("../../cli/bin/bothy.js", import.meta.url));
const pexec = promisify(execFile);
const UNKNOWN_SBX = "sbx_aaaaaaaaaaaaaaaaaaaa";
const UNKNOWN_CMD = "cmd_aaaaaaaaaaaaaaaaaaaa";
const UNKNOWN_SNAP = "snap_aaaaaaaaaaaaaaaaaaaa";

describe("API keys, scopes and tenants", () => {
  let ts: TestServer;
  let admin: string;
  const minted: string[] = [];
  /** Tenant a's objects. */
  const a = {
    key: "",
    sandbox: "",
    command: "",
    conversation: "conv-a",
    turn: "turn-a",
    document: "",
    secret: "a_secret",
    snapshot: "",
  };
  let bKey = "";
  /** Tenant b's key for its vault (the default scopes lack `secrets`). */
  let bSecretsKey = "";

  async function mint(key: string, body: Record<string, unknown>): Promise<{ key: string; key_id: string }> {
    const res = await call(ts.url, key, "POST", "/keys", body);
    expect(res.status, res.text).toBe(201);
    const made = res.json as { key: string; key_id: string };
    minted.push(made.key);
    return made;
  }

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor" });
    admin = ts.apiKey;
    for (const tenant of ["a", "b"])
      expect((await call(ts.url, admin, "POST", "/tenants", { tenant })).status).toBe(201);
    a.key = (await mint(admin, { tenant: "a", name: "a" })).key;
    bKey = (await mint(admin, { tenant: "b", name: "b" })).key;
    bSecretsKey = (await mint(admin, { tenant: "b", name: "b-vault", scopes: ["secrets"] })).key;

    const created = await call(ts.url, a.key, "POST", "/sandboxes", { template: "seed", memory_mib: 256 });
    expect(created.status, created.text).toBe(201);
    a.sandbox = String(created.json["sandbox_id"]);
    // A finished command of a's, through its own socket.
    const opened = await upgrade(`${ts.wsUrl}/sandboxes/${a.sandbox}/command`, a.key);
    const ws = opened.ws;
    if (!ws) throw new Error(`command socket refused: ${opened.status} ${opened.body}`);
    a.command = await new Promise<string>((resolve, reject) => {
      let id = "";
      ws.on("message", (data) => {
        const ev = JSON.parse(data.toString()) as { type: string; command_id?: string };
        if (ev.type === "started" && ev.command_id) id = ev.command_id;
      });
      ws.on("close", () => (id ? resolve(id) : reject(new Error("no command id"))));
      ws.send(JSON.stringify({ cmd: "echo mine > /tmp/a.txt" }));
    });
    const secret = { value: "a-secret-value", hosts: ["api.example.com"] };
    expect((await call(ts.url, admin, "PUT", `/secrets/${a.secret}?tenant=a`, secret)).status).toBe(201);
    const snap = await call(ts.url, a.key, "POST", `/sandboxes/${a.sandbox}/snapshots`, {});
    expect(snap.status, snap.text).toBe(201);
    a.snapshot = String(snap.json["snapshot_id"]);
    // A volume of a's under the secret's name: `{name}` in the battery below names both.
    expect((await call(ts.url, a.key, "POST", "/volumes", { name: a.secret, size_mib: 16 })).status).toBe(201);
    expect((await call(ts.url, a.key, "POST", "/conversations", { conversation_id: a.conversation })).status).toBe(201);
    expect(
      (await call(ts.url, a.key, "POST", `/conversations/${a.conversation}/turns`, { turn_id: a.turn })).status,
    ).toBe(201);
    const doc = await fetch(`${ts.url}/corpus?name=secret.txt`, {
      method: "POST",
      headers: { authorization: `Bearer ${a.key}`, "content-type": "text/plain" },
      body: "the quarterly plan of tenant a mentions zanzibar",
    });
    expect(doc.status).toBe(201);
    a.document = String(((await doc.json()) as Record<string, unknown>)["id"]);
  });

  afterAll(async () => {
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  /** A path of the document with the ids of tenant a's objects (or unknown ones) filled in. */
  function fill(path: string, ids: "a" | "unknown"): string {
    const known = ids === "a";
    const id = path.startsWith("/conversations")
      ? known
        ? a.conversation
        : "conv-nobody"
      : path.startsWith("/corpus")
        ? known
          ? a.document
          : "doc_aaaaaaaaaaaaaaaaaaaa"
        : path.startsWith("/snapshots")
          ? known
            ? a.snapshot
            : UNKNOWN_SNAP
          : path.startsWith("/keys") || path.startsWith("/tenants")
            ? known
              ? "a"
              : "nobody"
            : known
              ? a.sandbox
              : UNKNOWN_SBX;
    return path
      .replace("{id}", id)
      .replace("{commandId}", known ? a.command : UNKNOWN_CMD)
      .replace("{name}", known ? a.secret : "nobody_secret")
      .replace("{turn}", a.turn)
      .replace("{export}", "exp_aaaaaaaaaaaaaaaaaaaa")
      .replace("{port}", "8080")
      .replace("/*", "/x");
  }

  /** An answer with its ids taken out, to compare another tenant's id with an unknown one. */
  const shape = (r: { status: number; body: string }): string =>
    `${r.status} ${r.body
      .replaceAll(a.sandbox, "ID")
      .replaceAll(UNKNOWN_SBX, "ID")
      .replaceAll(a.snapshot, "SNAP")
      .replaceAll(UNKNOWN_SNAP, "SNAP")
      .replaceAll(a.command, "CMD")
      .replaceAll(UNKNOWN_CMD, "CMD")
      .replaceAll(a.conversation, "CONV")
      .replaceAll("conv-nobody", "CONV")
      .replaceAll(a.document, "DOC")
      .replaceAll("doc_aaaaaaaaaaaaaaaaaaaa", "DOC")
      .replaceAll(a.secret, "SECRET")
      .replaceAll("nobody_secret", "SECRET")}`;

  it("answers tenant b on tenant a's objects exactly as on unknown ids, on every route of /openapi.json", async () => {
    const doc = (await call(ts.url, undefined, "GET", "/openapi.json")).json;
    const ops = operations(doc).filter((op) => op.path.includes("{"));
    expect(ops.length).toBeGreaterThan(20);
    const differ: string[] = [];
    for (const op of ops) {
      // Keys and tenants are admin objects: b's key lacks the scope, whatever the id.
      if (op.scope === "admin" || op.scope === "keys:manage") continue;
      // Secret names are per tenant: b's PUT of a's name makes b's own secret.
      if (op.method === "PUT" && op.path === "/secrets/{name}") continue;
      // b's key lacks approvals:decide (403 whatever the id); approvals.test.ts runs this check with a key that has it.
      if (op.scope === "approvals:decide") continue;
      const body = op.method === "GET" || op.method === "DELETE" || op.method === "OPTIONS" ? undefined : {};
      const key = op.scope === "secrets" ? bSecretsKey : bKey;
      const theirs = await call(ts.url, key, op.method, fill(op.path, "a"), body);
      const unknown = await call(ts.url, key, op.method, fill(op.path, "unknown"), body);
      const got = shape({ status: theirs.status, body: theirs.text });
      const want = shape({ status: unknown.status, body: unknown.text });
      if (theirs.status !== 404 || got !== want) differ.push(`${op.method} ${op.path}: ${got} vs unknown ${want}`);
      if (op.websocket) {
        const ws = await upgrade(`${ts.wsUrl}${fill(op.path, "a")}`, bKey);
        const wsUnknown = await upgrade(`${ts.wsUrl}${fill(op.path, "unknown")}`, bKey);
        if (ws.status !== 404 || shape(ws) !== shape(wsUnknown))
          differ.push(`WS ${op.path}: ${shape(ws)} vs unknown ${shape(wsUnknown)}`);
      }
    }
    expect(differ).toEqual([]);
    // a's own key still reaches them (the battery above is not passing on a broken route).
    expect((await call(ts.url, a.key, "GET", `/sandboxes/${a.sandbox}`)).status).toBe(200);
    expect((await call(ts.url, a.key, "GET", `/conversations/${a.conversation}`)).status).toBe(200);
    expect((await call(ts.url, a.key, "GET", `/corpus/${a.document}`)).status).toBe(200);
    expect((await call(ts.url, a.key, "GET", `/volumes/${a.secret}`)).status).toBe(200);
    expect((await call(ts.url, a.key, "GET", `/snapshots/${a.snapshot}`)).status).toBe(200);
  });

  it("keeps lists, events, usage, the E2B surface and MCP tools to the caller's tenant", async () => {
    const listed = (await call(ts.url, bKey, "GET", "/sandboxes")).json["sandboxes"] as Array<{ sandbox_id: string }>;
    expect(listed.map((s) => s.sandbox_id)).not.toContain(a.sandbox);
    const adminList = (await call(ts.url, admin, "GET", "/sandboxes")).json["sandboxes"] as Array<{
      sandbox_id: string;
    }>;
    expect(adminList.map((s) => s.sandbox_id)).toContain(a.sandbox);
    expect((await call(ts.url, bKey, "GET", "/corpus")).json["documents"]).toEqual([]);
    expect((await call(ts.url, bKey, "GET", `/usage?sandbox_id=${a.sandbox}`)).status).toBe(404);
    const usage = (await call(ts.url, bKey, "GET", "/usage")).json["owners"] as Array<{ owner: string }>;
    expect(usage.every((o) => o.owner === "b")).toBe(true);
    const days = (await call(ts.url, bKey, "GET", "/usage/days")).json["days"] as Array<{ owner: string }>;
    expect(days.every((d) => d.owner === "b")).toBe(true);
    // Usage per sandbox: a's sandbox is in a's answer and the admin's, never in b's.
    const perSandbox = async (key: string): Promise<string[]> =>
      ((await call(ts.url, key, "GET", "/usage/sandboxes")).json["sandboxes"] as Array<{ sandbox_id: string }>).map(
        (s) => s.sandbox_id,
      );
    expect(await perSandbox(a.key)).toContain(a.sandbox);
    expect(await perSandbox(admin)).toContain(a.sandbox);
    expect(await perSandbox(bKey)).not.toContain(a.sandbox);

    // E2B's control plane: a bothy key in X-API-Key, and the same isolation.
    const e2b = (path: string, key: string, method = "GET", body?: unknown) =>
      call(ts.url, undefined, method, `/e2b${path}`, body, { "x-api-key": key });
    expect((await e2b(`/sandboxes/${a.sandbox}`, bKey)).status).toBe(404);
    expect((await e2b(`/sandboxes/${a.sandbox}`, a.key)).status).toBe(200);
    expect((await e2b(`/sandboxes/${a.sandbox}/timeout`, bKey, "POST", { timeout: 60 })).status).toBe(404);
    expect((await e2b(`/v2/sandboxes/${a.sandbox}/connect`, bKey, "POST", { timeout: 60 })).status).toBe(404);
    expect((await e2b(`/sandboxes/${a.sandbox}`, bKey, "DELETE")).status).toBe(404);
    const e2bList = (await e2b("/v2/sandboxes", bKey)).json as unknown as Array<{ sandboxID: string }>;
    expect(e2bList.map((s) => s.sandboxID)).not.toContain(a.sandbox);
    expect((await e2b("/v2/sandboxes", "bothy_0")).status).toBe(401);

    // Events: b's replay from the start shows its own marker and nothing of a's.
    const marker = await call(ts.url, bKey, "POST", "/sandboxes", { template: "seed", memory_mib: 256 });
    expect(marker.status).toBe(201);
    const bSandbox = String(marker.json["sandbox_id"]);
    const seen = await readEvents(ts.url, bKey, (ev) => ev["sandbox_id"] === bSandbox);
    expect(seen.some((ev) => ev["sandbox_id"] === a.sandbox)).toBe(false);
    expect((await call(ts.url, bKey, "DELETE", `/sandboxes/${bSandbox}`)).status).toBe(200);

    // MCP: b's rag_search does not find a's document; a's does.
    const ragSearch = async (key: string): Promise<string> => {
      const client = new Client({ name: "auth-test", version: "1" });
      await client.connect(
        new StreamableHTTPClientTransport(new URL(`${ts.url}/mcp`), {
          requestInit: { headers: { authorization: `Bearer ${key}` } },
        }),
      );
      try {
        const found = (await client.callTool({ name: "rag_search", arguments: { query: "zanzibar" } })) as {
          content: Array<{ text?: string }>;
        };
        const text = found.content.map((c) => c.text ?? "").join("\n");
        bodies.push(text);
        return text;
      } finally {
        await client.close();
      }
    };
    const theirs = await ragSearch(bKey);
    expect(theirs).toContain("No passages match");
    expect(theirs).not.toContain("quarterly plan");
    expect(theirs).not.toContain(a.document);
    expect(await ragSearch(a.key)).toContain("quarterly plan");
  });

  it("makes two sandboxes for one Idempotency-Key in two tenants", async () => {
    const body = { template: "seed", memory_mib: 256 };
    const inA = await call(ts.url, a.key, "POST", "/sandboxes", body, { "idempotency-key": "same-key" });
    const inB = await call(ts.url, bKey, "POST", "/sandboxes", body, { "idempotency-key": "same-key" });
    expect([inA.status, inB.status]).toEqual([201, 201]);
    expect(inA.json["sandbox_id"]).not.toBe(inB.json["sandbox_id"]);
    const again = await call(ts.url, a.key, "POST", "/sandboxes", body, { "idempotency-key": "same-key" });
    expect([again.status, again.json["sandbox_id"]]).toEqual([200, inA.json["sandbox_id"]]);
    expect((await call(ts.url, a.key, "DELETE", `/sandboxes/${String(inA.json["sandbox_id"])}`)).status).toBe(200);
    expect((await call(ts.url, bKey, "DELETE", `/sandboxes/${String(inB.json["sandbox_id"])}`)).status).toBe(200);
  });

  it("refuses a missing, garbage, unknown, altered, expired or revoked key with 401 and WWW-Authenticate", async () => {
    const expiring = await mint(admin, { tenant: "a", expires_in_s: 1 });
    const revoked = await mint(admin, { tenant: "a" });
    expect((await call(ts.url, admin, "DELETE", `/keys/${revoked.key_id}`)).status).toBe(200);
    const last = a.key.at(-1) === "0" ? "1" : "0";
    const altered = `${a.key.slice(0, -1)}${last}`;
    const unknown = `bothy_${"ab".repeat(32)}`;
    // The expiring key's second has surely passed once a later second has begun.
    const until = Date.now() + 1100;
    while (Date.now() < until) await new Promise((r) => setTimeout(r, 100));
    const cases: Array<[string, Record<string, string>]> = [
      ["none", ANONYMOUS],
      ["garbage", { authorization: "Bearer not-a-key" }],
      ["not bearer", { authorization: `Basic ${a.key}` }],
      ["unknown", { authorization: `Bearer ${unknown}` }],
      ["altered", { authorization: `Bearer ${altered}` }],
      ["altered X-API-Key", { "x-api-key": altered }],
      ["expired", { authorization: `Bearer ${expiring.key}` }],
      ["revoked", { authorization: `Bearer ${revoked.key}` }],
    ];
    const doc = (await call(ts.url, undefined, "GET", "/openapi.json")).json;
    const wrong: string[] = [];
    for (const [name, headers] of cases)
      for (const op of operations(doc)) {
        if (op.scope === "public") continue;
        const res = await fetch(`${ts.url}${fill(op.path, "a")}`, { method: op.method, headers });
        const text = await res.text();
        bodies.push(text);
        const problem = text ? (JSON.parse(text) as Record<string, unknown>) : {};
        if (
          res.status !== 401 ||
          problem["code"] !== "unauthorized" ||
          !/^Bearer realm="bothy"/.test(res.headers.get("www-authenticate") ?? "")
        )
          wrong.push(`${name} ${op.method} ${op.path}: ${res.status} ${text.slice(0, 100)}`);
      }
    expect(wrong).toEqual([]);
    // The WebSocket upgrade, the event stream and /mcp are refused the same way.
    expect((await upgrade(`${ts.wsUrl}/sandboxes/${a.sandbox}/command`, altered)).status).toBe(401);
    expect((await call(ts.url, revoked.key, "GET", "/events")).status).toBe(401);
    expect((await call(ts.url, expiring.key, "POST", "/mcp", {})).status).toBe(401);
    // Public routes stay public.
    expect((await call(ts.url, undefined, "GET", "/healthz")).status).toBe(200);
    // X-API-Key works as well as Bearer.
    expect((await call(ts.url, undefined, "GET", "/sandboxes", undefined, { "x-api-key": a.key })).status).toBe(200);
  });

  it("refuses a key without the route's scope with 403 naming it, on every route", async () => {
    const doc = (await call(ts.url, undefined, "GET", "/openapi.json")).json;
    const scopes = API_SCOPES.filter((s) => s !== "admin");
    const lacking = new Map<string, string>();
    for (const scope of [...scopes, "admin"])
      lacking.set(scope, (await mint(admin, { tenant: "a", scopes: scopes.filter((s) => s !== scope) })).key);
    const wrong: string[] = [];
    for (const op of operations(doc)) {
      // Public routes need nothing; `key` routes (GET /policy) take any key.
      if (op.scope === "public" || op.scope === "key") continue;
      const key = lacking.get(op.scope);
      if (!key) throw new Error(`${op.method} ${op.path} needs ${op.scope}`);
      if (op.websocket && op.method === "GET") {
        const res = await upgrade(`${ts.wsUrl}${fill(op.path, "a")}`, key);
        if (res.status !== 403 || !res.body.includes(op.scope)) wrong.push(`WS ${op.path}: ${res.status} ${res.body}`);
        continue;
      }
      const body = op.method === "GET" || op.method === "DELETE" || op.method === "OPTIONS" ? undefined : {};
      const res = await call(ts.url, key, op.method, fill(op.path, "a"), body);
      if (res.status !== 403 || res.json["code"] !== "scope_missing" || res.json["scope"] !== op.scope)
        wrong.push(`${op.method} ${op.path}: ${res.status} ${res.text.slice(0, 120)}`);
    }
    expect(wrong).toEqual([]);
    // A key mints only within its own scopes.
    const manager = await mint(admin, { tenant: "a", scopes: ["keys:manage", "sandboxes:read"] });
    const beyond = await call(ts.url, manager.key, "POST", "/keys", { scopes: ["sandboxes:write"] });
    expect([beyond.status, beyond.json["scope"]]).toEqual([403, "sandboxes:write"]);
    const within = await call(ts.url, manager.key, "POST", "/keys", { scopes: ["sandboxes:read"] });
    expect(within.status).toBe(201);
    minted.push(String(within.json["key"]));
    // ... and only in its own tenant; it revokes no stronger key, and no other tenant's.
    expect((await call(ts.url, manager.key, "POST", "/keys", { tenant: "b" })).status).toBe(404);
    const stronger = await mint(admin, { tenant: "a", scopes: ["sandboxes:write"] });
    const refused = await call(ts.url, manager.key, "DELETE", `/keys/${stronger.key_id}`);
    expect([refused.status, refused.json["scope"]]).toEqual([403, "sandboxes:write"]);
    const bManager = await mint(admin, { tenant: "b", scopes: ["keys:manage", "sandboxes:read"] });
    const theirs = await call(ts.url, bManager.key, "DELETE", `/keys/${stronger.key_id}`);
    const unknown = await call(ts.url, bManager.key, "DELETE", "/keys/key_aaaaaaaaaaaaaaaaaaaa");
    expect([theirs.status, theirs.text.replaceAll(stronger.key_id, "ID")]).toEqual([
      404,
      unknown.text.replaceAll("key_aaaaaaaaaaaaaaaaaaaa", "ID"),
    ]);
  });

  it("ends a revoked key's open command socket and event stream, and refuses its next request", async () => {
    const doomed = await mint(admin, { tenant: "a" });
    const opened = await upgrade(`${ts.wsUrl}/sandboxes/${a.sandbox}/command`, doomed.key);
    const ws = opened.ws;
    if (!ws) throw new Error(`refused: ${opened.status}`);
    const closed = new Promise<void>((resolve) => ws.on("close", () => resolve()));
    const started = new Promise<void>((resolve) =>
      ws.on("message", (d) => {
        if ((JSON.parse(d.toString()) as { type: string }).type === "started") resolve();
      }),
    );
    ws.send(JSON.stringify({ cmd: "sleep 300" }));
    await started;
    const events = await fetch(`${ts.url}/events`, { headers: { authorization: `Bearer ${doomed.key}` } });
    expect(events.status).toBe(200);
    const reader = events.body?.getReader();
    await reader?.read();
    const streamEnded = (async () => {
      try {
        for (;;) if ((await reader?.read())?.done !== false) return;
      } catch {
        return;
      }
    })();
    expect((await call(ts.url, admin, "DELETE", `/keys/${doomed.key_id}`)).status).toBe(200);
    await closed;
    await streamEnded;
    expect((await call(ts.url, doomed.key, "GET", "/sandboxes")).status).toBe(401);
    const keys = (await call(ts.url, admin, "GET", "/keys")).json["keys"] as Array<Record<string, unknown>>;
    const shown = keys.find((k) => k["key_id"] === doomed.key_id);
    expect(shown?.["revoked_at"]).toEqual(expect.any(String));
    expect(shown?.["display"]).toBe(`${doomed.key.slice(0, 10)}…${doomed.key.slice(-4)}`);
  });

  it("refuses a create past a tenant's quota with 429 quota_exceeded, leaving nothing half-made", async () => {
    expect((await call(ts.url, admin, "POST", "/tenants", { tenant: "q", quota: { max_sandboxes: 1 } })).status).toBe(
      201,
    );
    const q = (await mint(admin, { tenant: "q" })).key;
    const first = await call(ts.url, q, "POST", "/sandboxes", { template: "seed", memory_mib: 256 });
    expect(first.status).toBe(201);
    const second = await call(ts.url, q, "POST", "/sandboxes", { template: "seed", memory_mib: 256 });
    expect([second.status, second.json["code"], second.json["quota"], second.json["limit"]]).toEqual([
      429,
      "quota_exceeded",
      "max_sandboxes",
      1,
    ]);
    const rows = (await ts.server.ledger.listSandboxes({ includeDeleted: true })).filter((r) => r.tenant === "q");
    expect(rows.map((r) => r.id)).toEqual([first.json["sandbox_id"]]);
    // Memory: 256 MiB live, a quota of 384 leaves no room for another 256.
    const patched = await call(ts.url, admin, "PATCH", "/tenants/q/quota", {
      max_sandboxes: null,
      max_memory_mib: 384,
    });
    expect(patched.status).toBe(200);
    const third = await call(ts.url, q, "POST", "/sandboxes", { template: "seed", memory_mib: 256 });
    expect([third.status, third.json["quota"]]).toEqual([429, "max_memory_mib"]);
    const tenant = (await call(ts.url, admin, "GET", "/tenants/q")).json;
    expect(tenant["live"]).toMatchObject({ sandboxes: 1, memory_mib: 256 });
    expect((await call(ts.url, q, "DELETE", `/sandboxes/${String(first.json["sandbox_id"])}`)).status).toBe(200);
  });

  it("keeps the key out of the sandbox: the port proxy drops it, and leaves the app's own Authorization", async () => {
    const box = await Sandbox.connect(a.sandbox, { baseUrl: ts.url, apiKey: a.key });
    const echo = `require("http").createServer((q, s) => s.end(JSON.stringify(q.headers))).listen(8089)`;
    const handle = await box.commands.run(`node -e '${echo}'`, { background: true });
    handle.disconnect();
    for (;;) {
      const ports = (await call(ts.url, a.key, "GET", `/sandboxes/${a.sandbox}/ports`)).json["ports"] as Array<{
        port: number;
      }>;
      if (ports.some((p) => p.port === 8089)) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const viaBearer = await call(ts.url, a.key, "GET", `/sandboxes/${a.sandbox}/ports/8089/`);
    expect(viaBearer.status).toBe(200);
    expect(viaBearer.json["authorization"]).toBeUndefined();
    const viaHeader = await call(ts.url, undefined, "GET", `/sandboxes/${a.sandbox}/ports/8089/`, undefined, {
      authorization: "Basic YXBwOnNlY3JldA==",
      "x-api-key": a.key,
    });
    expect(viaHeader.status).toBe(200);
    expect(viaHeader.json["authorization"]).toBe("Basic YXBwOnNlY3JldA==");
    expect(viaHeader.json["x-api-key"]).toBeUndefined();
    expect(viaBearer.text + viaHeader.text).not.toContain("bothy_");
    await box.commands.kill(handle.commandId);
  });

  it("bothy keys and bothy tenants, with the admin key taken from $BOTHY_HOME/admin.key when BOTHY_API_KEY is unset", async () => {
    const env: NodeJS.ProcessEnv = { ...process.env, BOTHY_URL: ts.url, BOTHY_HOME: ts.home };
    delete env["BOTHY_API_KEY"];
    const bothy = async (...args: string[]): Promise<string> =>
      (await pexec(process.execPath, [BOTHY, ...args], { env })).stdout;
    expect(await bothy("tenants", "create", "cli", "max_sandboxes=3")).toContain("max_sandboxes=3");
    const key = (
      await bothy("keys", "create", "--tenant", "cli", "--name", "from-cli", "--scope", "sandboxes:read")
    ).trim();
    minted.push(key);
    expect(key).toMatch(/^bothy_[0-9a-f]{64}$/);
    const listed = JSON.parse(await bothy("keys", "ls", "--json")) as { keys: Array<Record<string, unknown>> };
    const made = listed.keys.find((k) => k["name"] === "from-cli");
    expect(made).toMatchObject({ tenant: "cli", scopes: ["sandboxes:read"] });
    expect(JSON.stringify(listed)).not.toContain(key);
    // The new key works for what its scope allows, from BOTHY_API_KEY.
    const ls = await pexec(process.execPath, [BOTHY, "ls", "--json"], { env: { ...env, BOTHY_API_KEY: key } });
    expect(JSON.parse(ls.stdout)).toEqual({ sandboxes: [] });
    expect(await bothy("keys", "revoke", String(made?.["key_id"]))).toContain(String(made?.["key_id"]));
    expect(await bothy("tenants", "quota", "cli", "max_sandboxes=none", "max_vcpu=4")).toContain("max_vcpu=4");
    const tenants = JSON.parse(await bothy("tenants", "ls", "--json")) as { tenants: Array<{ tenant: string }> };
    expect(tenants.tenants.map((t) => t.tenant)).toEqual(expect.arrayContaining(["default", "a", "b", "cli"]));
  });

  it("never writes a raw key to the home (ledger and WAL included), the log, events or answers", async () => {
    const keys = [...minted];
    expect(keys.length).toBeGreaterThan(5);
    // No file holds a minted key; only admin.key (0600, written once) holds the admin key, by design.
    expect((await homeFilesHolding(ts.home, keys)).hits).toEqual([]);
    expect((await homeFilesHolding(ts.home, [admin])).hits).toEqual([join(ts.home, "admin.key")]);
    expect((await stat(join(ts.home, "admin.key"))).mode & 0o777).toBe(0o600);
    expect((await stat(join(ts.home, "secrets", "pepper"))).mode & 0o777).toBe(0o600);
    const log = await readFile(ts.logPath, "utf8");
    const events = JSON.stringify(ts.events);
    for (const key of [...keys, admin]) {
      expect(log.includes(key)).toBe(false);
      expect(events.includes(key)).toBe(false);
      expect(bodies.some((b) => b.includes(key))).toBe(false);
    }
  });
});

/** Replays a key's events from the start until one matches `until`; answers what it read. */
async function readEvents(
  base: string,
  key: string,
  until: (ev: Record<string, unknown>) => boolean,
): Promise<Array<Record<string, unknown>>> {
  const res = await fetch(`${base}/events?since=0`, { headers: { authorization: `Bearer ${key}` } });
  const reader = res.body?.getReader();
  if (!reader) throw new Error("no event stream");
  const seen: Array<Record<string, unknown>> = [];
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) throw new Error("event stream ended");
      buffer += new TextDecoder().decode(value);
      for (let i = buffer.indexOf("\n\n"); i >= 0; i = buffer.indexOf("\n\n")) {
        const block = buffer.slice(0, i);
        buffer = buffer.slice(i + 2);
        const data = block.split("\n").find((l) => l.startsWith("data: "));
        if (!data) continue;
        const ev = JSON.parse(data.slice(6)) as Record<string, unknown>;
        seen.push(ev);
        if (until(ev)) return seen;
      }
    }
  } finally {
    await reader.cancel();
  }
}
