/**
 * Approvals on a real server: what the broker holds is listed, shown, approved and denied over
 * HTTP (once: a second decision is 409); another tenant sees and decides none of them, exactly as
 * unknown ids; a key without approvals:decide is refused; the events reach /events, the ledger and
 * a signed webhook on loopback.
 */
import { execFile, spawn } from "node:child_process";
import { createHmac, timingSafeEqual } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import type { ApprovalInfo, BothyEvent } from "@bothy/protocol";
import { Approvals, ConflictError, NotFoundError } from "@bothy/sdk";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ApprovalAsk } from "../src/gateway/contracts.ts";
import { readEventStream } from "./helpers/background.ts";
import { api, waitDeleted } from "./helpers/client.ts";
import { driverTitle, testDriver } from "./helpers/drivers.ts";
import { noLeaks } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

const BOTHY = fileURLToPath(new URL("../../cli/bin/bothy.js", import.meta.url));
const pexec = promisify(execFile);
const SECRET = "test-webhook-secret-0123456789";
const SBX = "sbx_aaaaaaaaaaaaaaaaaaaa";
const UNKNOWN = "apr_aaaaaaaaaaaaaaaaaaaa";
const gvisor = testDriver("gvisor");

interface Delivery {
  raw: string;
  signature: string | undefined;
  event: BothyEvent;
}

let ts: TestServer;
let hook: Server;
const deliveries: Delivery[] = [];
const waiting: Array<() => void> = [];
/** Keys: the default tenant's decider, its agent (default scopes), and tenant b's decider. */
const keys = { decider: "", deciderId: "", agent: "", b: "" };

const as = (key: string): Record<string, string> => ({ authorization: `Bearer ${key}` });

async function mint(body: Record<string, unknown>): Promise<{ key: string; key_id: string }> {
  const res = await api(ts.url, "POST", "/keys", body);
  expect(res.status, JSON.stringify(res.json)).toBe(201);
  return res.json as { key: string; key_id: string };
}

const ask = (over: Partial<ApprovalAsk> = {}): ApprovalAsk => ({
  tenant: "default",
  sandboxId: SBX,
  conversationId: null,
  kind: "http",
  method: "POST",
  host: "api.example.com",
  path: "/v1/orders",
  tool: null,
  excerpt: '{"amount":42}',
  rule: "sandbox#0",
  ...over,
});

/** Asks, and answers the id the server listed as pending, with the held outcome. */
async function hold(over: Partial<ApprovalAsk> = {}, signal = new AbortController().signal) {
  const outcome = ts.server.approvals.ask(ask(over), signal);
  const listed = await api(ts.url, "GET", "/approvals?state=pending", undefined, as(keys.decider));
  const pending = listed.json["approvals"] as Array<{ approval_id: string; excerpt: string }>;
  const id = pending.find((a) => a.excerpt === (over.excerpt ?? '{"amount":42}'))?.approval_id;
  if (!id) throw new Error(`not listed: ${JSON.stringify(listed.json)}`);
  return { id, outcome };
}

/** Waits until the webhook received an event that `match` accepts. */
async function delivered(match: (ev: BothyEvent) => boolean): Promise<Delivery> {
  for (;;) {
    const found = deliveries.find((d) => match(d.event));
    if (found) return found;
    await new Promise<void>((resolve) => waiting.push(resolve));
  }
}

beforeAll(async () => {
  hook = createServer((req, res) => {
    let raw = "";
    req.on("data", (c: Buffer) => (raw += c.toString("utf8")));
    req.on("end", () => {
      const sig = req.headers["bothy-signature"];
      deliveries.push({ raw, signature: Array.isArray(sig) ? sig[0] : sig, event: JSON.parse(raw) as BothyEvent });
      res.writeHead(204).end();
      for (const wake of waiting.splice(0)) wake();
    });
  });
  await new Promise<void>((r) => hook.listen(0, "127.0.0.1", r));
  ts = await startTestServer({
    BOTHY_WEBHOOK_URL: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/hook`,
    BOTHY_WEBHOOK_SECRET: SECRET,
    BOTHY_DRIVER: "gvisor",
  });
  const decider = await mint({ name: "decider", scopes: ["approvals:decide", "sandboxes:read"] });
  keys.decider = decider.key;
  keys.deciderId = decider.key_id;
  keys.agent = (await mint({ name: "agent" })).key;
  expect((await api(ts.url, "POST", "/tenants", { tenant: "b" })).status).toBe(201);
  keys.b = (await mint({ tenant: "b", name: "b", scopes: ["approvals:decide", "sandboxes:read"] })).key;
});

afterAll(async () => {
  ts.server.approvals.stop();
  expect(await ts?.stop()).toEqual(noLeaks());
  await new Promise((r) => hook.close(r));
});

describe("approvals over HTTP", () => {
  it("lists, shows and approves a held request once; a second decision is 409", async () => {
    const { id, outcome } = await hold();
    const shown = await api(ts.url, "GET", `/approvals/${id}`, undefined, as(keys.decider));
    expect(shown.status).toBe(200);
    expect(shown.json).toMatchObject({
      approval_id: id,
      tenant: "default",
      sandbox_id: SBX,
      kind: "http",
      method: "POST",
      host: "api.example.com",
      path: "/v1/orders",
      excerpt: '{"amount":42}',
      rule: "sandbox#0",
      state: "pending",
      decided_by: null,
    });
    const approved = await api(ts.url, "POST", `/approvals/${id}/approve`, {}, as(keys.decider));
    expect(approved.status).toBe(200);
    expect(approved.json).toMatchObject({ state: "approved", decided_by: keys.deciderId, grant: { kind: "once" } });
    expect(await outcome).toEqual({ approvalId: id, state: "approved" });

    for (const verb of ["approve", "deny"]) {
      const again = await api(ts.url, "POST", `/approvals/${id}/${verb}`, {}, as(keys.decider));
      expect(again.status).toBe(409);
      expect(again.type).toContain("application/problem+json");
      expect(again.json).toMatchObject({ code: "approval_not_pending", state: "approved" });
    }
    expect(await ts.server.ledger.approvals.get(id)).toMatchObject({ state: "approved", decided_by: keys.deciderId });
  });

  it("denies with a reason; a host grant is shown with its end", async () => {
    const denied = await hold({ excerpt: "deny me" });
    const res = await api(ts.url, "POST", `/approvals/${denied.id}/deny`, { reason: "no" }, as(keys.decider));
    expect(res.json).toMatchObject({ state: "denied", reason: "no", decided_by: keys.deciderId });
    expect(await denied.outcome).toMatchObject({ state: "denied", reason: "no" });

    const granted = await hold({ excerpt: "grant host" });
    const bad = await api(ts.url, "POST", `/approvals/${granted.id}/approve`, { grant: "host" }, as(keys.decider));
    expect([bad.status, bad.json["code"]]).toEqual([400, "invalid_request"]);
    const ok = await api(
      ts.url,
      "POST",
      `/approvals/${granted.id}/approve`,
      { grant: "host", minutes: 10 },
      as(keys.decider),
    );
    expect(ok.json).toMatchObject({ state: "approved", grant: { kind: "host" } });
    expect((await granted.outcome).state).toBe("approved");
    expect(await ts.server.approvals.granted(SBX, "api.example.com")).toBe(true);
  });

  it("answers bad input with problems, never 5xx", async () => {
    const { id, outcome } = await hold({ excerpt: "bad input" });
    const cases: Array<[string, string, unknown, number, string]> = [
      ["POST", `/approvals/${id}/approve`, { grant: "forever" }, 400, "invalid_request"],
      ["POST", `/approvals/${id}/approve`, { minutes: 5 }, 400, "invalid_request"],
      ["POST", `/approvals/${id}/approve`, { extra: 1 }, 400, "invalid_request"],
      ["POST", `/approvals/${id}/deny`, { grant: "once" }, 400, "invalid_request"],
      ["POST", `/approvals/${id}/approve`, "[]", 400, "invalid_request"],
      ["GET", "/approvals?state=maybe", undefined, 400, "invalid_request"],
      ["GET", "/approvals?sandbox_id=nope", undefined, 400, "invalid_request"],
      ["GET", `/approvals/${UNKNOWN}`, undefined, 404, "approval_not_found"],
      ["GET", "/approvals/not-an-id", undefined, 404, "approval_not_found"],
      ["POST", `/approvals/${UNKNOWN}/approve`, {}, 404, "approval_not_found"],
    ];
    for (const [method, path, body, status, code] of cases) {
      const res = await api(ts.url, method, path, body, as(keys.decider));
      expect([method, path, res.status, res.json["code"]]).toEqual([method, path, status, code]);
      expect(res.type).toContain("application/problem+json");
    }
    expect((await ts.server.ledger.approvals.get(id))?.state).toBe("pending");
    await api(ts.url, "POST", `/approvals/${id}/deny`, {}, as(keys.decider));
    expect((await outcome).state).toBe("denied");
  });

  it("keeps approvals to their tenant: another's are unknown ids; a key without the scope gets 403", async () => {
    const { id, outcome } = await hold({ excerpt: "tenant a's" });
    const listed = await api(ts.url, "GET", "/approvals", undefined, as(keys.b));
    expect(listed.status).toBe(200);
    expect(listed.json["approvals"]).toEqual([]);
    for (const [method, suffix, body] of [
      ["GET", "", undefined],
      ["POST", "/approve", {}],
      ["POST", "/deny", {}],
    ] as const) {
      const theirs = await api(ts.url, method, `/approvals/${id}${suffix}`, body, as(keys.b));
      const unknown = await api(ts.url, method, `/approvals/${UNKNOWN}${suffix}`, body, as(keys.b));
      expect(theirs.status).toBe(404);
      expect(JSON.stringify(theirs.json).replaceAll(id, "ID")).toBe(
        JSON.stringify(unknown.json).replaceAll(UNKNOWN, "ID"),
      );
    }
    for (const [method, path] of [
      ["GET", "/approvals"],
      ["GET", `/approvals/${id}`],
      ["POST", `/approvals/${id}/approve`],
    ] as const) {
      const res = await api(ts.url, method, path, method === "POST" ? {} : undefined, as(keys.agent));
      expect([res.status, res.json["code"], res.json["scope"]]).toEqual([403, "scope_missing", "approvals:decide"]);
    }
    expect((await ts.server.ledger.approvals.get(id))?.state).toBe("pending");
    // The admin key sees every tenant's.
    const all = await api(ts.url, "GET", "/approvals?state=pending");
    expect((all.json["approvals"] as Array<{ approval_id: string }>).map((a) => a.approval_id)).toContain(id);
    await api(ts.url, "POST", `/approvals/${id}/approve`, {}, as(keys.decider));
    expect((await outcome).state).toBe("approved");
  });

  it("cancels a held request whose caller went away", async () => {
    const gone = new AbortController();
    const { id, outcome } = await hold({ excerpt: "going away" }, gone.signal);
    gone.abort();
    expect(await outcome).toMatchObject({ state: "cancelled", cancelReason: "client_gone" });
    const shown = await api(ts.url, "GET", `/approvals/${id}`, undefined, as(keys.decider));
    expect(shown.json).toMatchObject({ state: "cancelled", reason: "client_gone", decided_by: null });
  });

  it("announces requests and decisions on /events, in the ledger, and on a signed webhook", async () => {
    const { id, outcome } = await hold({ excerpt: "announce me" });
    await api(ts.url, "POST", `/approvals/${id}/approve`, {}, as(keys.decider));
    await outcome;

    const mine = (ev: BothyEvent): boolean => ev.data["approval_id"] === id;
    const seen = await readEventStream(ts.url, "?since=0", (evs) => evs.filter(mine).length >= 2);
    expect(seen.filter(mine).map((e) => e.type)).toEqual(["approval.requested", "approval.decided"]);
    expect(seen.find(mine)).toMatchObject({
      sandbox_id: SBX,
      data: { excerpt: "announce me", host: "api.example.com" },
    });
    // Kept in the ledger as the default tenant's (so tenant b's stream never shows them).
    const rows = (await ts.server.ledger.eventsSince(0)).filter((e) => e.type.startsWith("approval."));
    expect(rows.filter((e) => JSON.parse(e.data).approval_id === id).map((e) => [e.type, e.tenant])).toEqual([
      ["approval.requested", "default"],
      ["approval.decided", "default"],
    ]);

    const requested = await delivered((ev) => ev.type === "approval.requested" && mine(ev));
    const decided = await delivered((ev) => ev.type === "approval.decided" && mine(ev));
    for (const d of [requested, decided]) {
      const m = /^t=(\d+),v1=([0-9a-f]{64})$/.exec(d.signature ?? "");
      expect(m, d.signature).not.toBeNull();
      const [, t, v1] = m as RegExpExecArray;
      const want = createHmac("sha256", SECRET).update(`${t}.${d.raw}`).digest();
      expect(timingSafeEqual(Buffer.from(v1 ?? "", "hex"), want)).toBe(true);
      expect(Math.abs(Number(t) - Date.now() / 1000)).toBeLessThan(600);
    }
    expect(decided.event.data).toMatchObject({ state: "approved", decided_by: keys.deciderId });
    // A body altered in transit no longer matches.
    const [, t, v1] = /^t=(\d+),v1=([0-9a-f]{64})$/.exec(requested.signature ?? "") as RegExpExecArray;
    const forged = createHmac("sha256", SECRET).update(`${t}.${requested.raw.replace("announce", "Announce")}`);
    expect(forged.digest("hex")).not.toBe(v1);
  });

  it("are listed and decided with the SDK", async () => {
    const conn = { baseUrl: ts.url, apiKey: keys.decider };
    const { id, outcome } = await hold({ excerpt: "via sdk" });
    expect((await Approvals.list({ ...conn, state: "pending" })).map((a) => a.approval_id)).toContain(id);
    expect(await Approvals.get(id, conn)).toMatchObject({ approval_id: id, state: "pending" });
    expect(await Approvals.approve(id, { ...conn, hostMinutes: 3, reason: "fine" })).toMatchObject({
      state: "approved",
      grant: { kind: "host" },
      reason: "fine",
    });
    expect((await outcome).state).toBe("approved");
    await expect(Approvals.deny(id, conn)).rejects.toBeInstanceOf(ConflictError);
    await expect(Approvals.get("apr_aaaaaaaaaaaaaaaaaaaa", conn)).rejects.toBeInstanceOf(NotFoundError);
  });

  it("are watched, listed, approved and denied with the CLI", async () => {
    const env = { ...process.env, BOTHY_URL: ts.url, BOTHY_API_KEY: keys.decider };
    const before = await hold({ excerpt: "before watch" });
    const watcher = spawn(process.execPath, [BOTHY, "approvals", "watch", "--json"], { env });
    try {
      let errors = "";
      watcher.stderr.on("data", (d: Buffer) => (errors += d.toString()));
      const lines = createInterface({ input: watcher.stdout })[Symbol.asyncIterator]();
      const nextApproval = async (): Promise<{ approval_id: string; excerpt: string }> => {
        const line = await lines.next();
        if (line.done) throw new Error(`watch ended: ${errors}`);
        return JSON.parse(line.value) as { approval_id: string; excerpt: string };
      };
      // What is pending when it starts is printed first; then, once it says it watches, new ones.
      const watching = new Promise<void>((resolve) =>
        watcher.stderr.on("data", (d: Buffer) => d.toString().includes("watching") && resolve()),
      );
      expect((await nextApproval()).approval_id).toBe(before.id);
      await watching;
      const live = ts.server.approvals.ask(ask({ excerpt: "while watching" }), new AbortController().signal);
      const seen = await nextApproval();
      expect(seen.excerpt).toBe("while watching");

      const approve = await pexec(
        process.execPath,
        [BOTHY, "approvals", "approve", before.id, "--host-minutes", "5", "--reason", "ok"],
        { env },
      );
      expect(approve.stdout).toContain(`${before.id} approved`);
      expect((await before.outcome).state).toBe("approved");
      const deny = await pexec(process.execPath, [BOTHY, "approvals", "deny", seen.approval_id], { env });
      expect(deny.stdout).toContain(`${seen.approval_id} denied`);
      expect((await live).state).toBe("denied");
      const again = await pexec(process.execPath, [BOTHY, "approvals", "deny", seen.approval_id], { env }).catch(
        (err: { code: number; stderr: string }) => err,
      );
      expect(again).toMatchObject({ code: 1 });
      expect((again as { stderr: string }).stderr).toContain("approval_not_pending");
      const ls = await pexec(process.execPath, [BOTHY, "approvals", "ls", "--state", "denied", "--json"], { env });
      const denied = (JSON.parse(ls.stdout) as { approvals: Array<{ approval_id: string }> }).approvals;
      expect(denied.map((a) => a.approval_id)).toContain(seen.approval_id);
      const table = await pexec(process.execPath, [BOTHY, "approvals", "ls"], { env });
      expect(table.stdout).toContain("POST api.example.com/v1/orders");
    } finally {
      watcher.kill("SIGINT");
    }
  });
});

describe.skipIf(gvisor.missing !== undefined)(driverTitle(gvisor, "agent tools under a tools policy"), () => {
  const conversation = "conv-approvals";
  let sandboxId = "";
  let client: Client;

  beforeAll(async () => {
    const created = await api(ts.url, "POST", "/sandboxes", {
      template: "seed",
      memory_mib: 256,
      policy: { tools: { send_file: "ask", computer_bash: "deny" } },
    });
    expect(created.status, JSON.stringify(created.json)).toBe(201);
    sandboxId = String(created.json["sandbox_id"]);
    const conv = await api(ts.url, "POST", "/conversations", { conversation_id: conversation, sandbox_id: sandboxId });
    expect(conv.status, JSON.stringify(conv.json)).toBe(201);
    client = new Client({ name: "approvals-test", version: "1" });
    await client.connect(new StreamableHTTPClientTransport(new URL(`${ts.url}/mcp`)));
  });

  afterAll(async () => {
    await client?.close();
    // Deleting the conversation deletes the sandbox it works in.
    expect((await api(ts.url, "DELETE", `/conversations/${conversation}`)).status).toBe(200);
    if (sandboxId) expect(await waitDeleted(ts.url, sandboxId)).toBe("deleted");
  });

  const call = async (name: string, args: Record<string, unknown>): Promise<CallToolResult> =>
    (await client.callTool({ name, arguments: args, _meta: { "bothy/conversation_id": conversation } }, undefined, {
      timeout: 120_000,
    })) as CallToolResult;
  const textOf = (r: CallToolResult): string => r.content.map((c) => (c.type === "text" ? c.text : "")).join("\n");

  /** The sandbox's pending tool approval, once the held call has made it (polled). */
  async function pendingTool(): Promise<ApprovalInfo> {
    for (;;) {
      const res = await api(ts.url, "GET", `/approvals?state=pending&sandbox_id=${sandboxId}`);
      const found = (res.json["approvals"] as ApprovalInfo[]).find((a) => a.kind === "tool");
      if (found) return found;
      await new Promise((r) => setTimeout(r, 20)); // the poll's pace, not a wait for an outcome
    }
  }

  it("refuses a denied tool naming the rule, before it acts", async () => {
    const refused = await call("computer_bash", { command: "touch /workspace/ran" });
    expect(refused.isError).toBe(true);
    expect(refused._meta?.["bothy/refusal"]).toBe("policy_denied");
    expect(textOf(refused)).toContain("tools.computer_bash");
    const listed = await call("computer_read_file", { path: "/workspace/ran" });
    expect(listed._meta?.["bothy/refusal"]).toBe("not_found");
  });

  it("holds send_file until approved over HTTP, then sends; a denied one fails", async () => {
    expect(
      (await call("computer_write_file", { path: "report.txt", content: "quarterly numbers\n" })).isError,
    ).toBeFalsy();
    const exported = await call("computer_export_file", { path: "report.txt" });
    expect(exported.isError, textOf(exported)).toBeFalsy();
    const exportId = String(exported._meta?.["export_id"]);

    const sending = call("send_file", { export_id: exportId });
    const held = await pendingTool();
    expect(held).toMatchObject({
      tenant: "default",
      sandbox_id: sandboxId,
      conversation_id: conversation,
      kind: "tool",
      tool: "send_file",
      rule: "tools.send_file",
      method: null,
      host: null,
    });
    expect(JSON.parse(held.excerpt)).toEqual({ export_id: exportId });
    const approved = await api(ts.url, "POST", `/approvals/${held.approval_id}/approve`, {});
    expect(approved.status).toBe(200);
    const sent = await sending;
    expect(sent.isError, textOf(sent)).toBeFalsy();
    expect(textOf(sent)).toContain("Attached report.txt");
    const turn = String(sent._meta?.["bothy/turn_id"]);
    const view = await api(ts.url, "GET", `/conversations/${conversation}/turns/${turn}`);
    expect((view.json["attachments"] as Array<{ export_id: string }>).map((a) => a.export_id)).toEqual([exportId]);

    const again = call("send_file", { export_id: exportId });
    const second = await pendingTool();
    await api(ts.url, "POST", `/approvals/${second.approval_id}/deny`, { reason: "once is enough" });
    const denied = await again;
    expect(denied.isError).toBe(true);
    expect(denied._meta?.["bothy/refusal"]).toBe("not_approved");
    expect(textOf(denied)).toContain("once is enough");

    // Both are kept in the ledger, with their events.
    const rows = await ts.server.ledger.approvals.list({ sandboxId, limit: 10 });
    expect(rows.map((r) => [r.id, r.state])).toEqual([
      [second.approval_id, "denied"],
      [held.approval_id, "approved"],
    ]);
    const events = (await ts.server.ledger.eventsSince(0, sandboxId))
      .filter((e) => e.type.startsWith("approval."))
      .map((e) => `${e.type} ${String((JSON.parse(e.data) as { state: string }).state)}`);
    expect(events).toEqual([
      "approval.requested pending",
      "approval.decided approved",
      "approval.requested pending",
      "approval.decided denied",
    ]);
  });

  it("cancels the approval of a call its client cancelled", async () => {
    const controller = new AbortController();
    const sending = client.callTool(
      { name: "send_file", arguments: { export_id: "exp_gone" }, _meta: { "bothy/conversation_id": conversation } },
      undefined,
      { signal: controller.signal, timeout: 120_000 },
    );
    const held = await pendingTool();
    controller.abort();
    await expect(sending).rejects.toThrow();
    // The client's cancel reaches the server as a notification: poll the approval until it is decided.
    let state = "pending";
    while (state === "pending") {
      state = String((await api(ts.url, "GET", `/approvals/${held.approval_id}`)).json["state"]);
      await new Promise((r) => setTimeout(r, 20)); // the poll's pace, not a wait for an outcome
    }
    expect((await api(ts.url, "GET", `/approvals/${held.approval_id}`)).json).toMatchObject({
      state: "cancelled",
      reason: "client_gone",
    });
  });

  it("asks the MCP client's user through elicitation when the caller's key may decide, never an agent's", async () => {
    const exported = await call("computer_export_file", { path: "report.txt", name: "again.txt" });
    const exportId = String(exported._meta?.["export_id"]);
    const asked: string[] = [];
    const elicitingClient = async (headers: Record<string, string>): Promise<Client> => {
      const c = new Client({ name: "approvals-elicit", version: "1" }, { capabilities: { elicitation: { form: {} } } });
      c.setRequestHandler(ElicitRequestSchema, async (request) => {
        asked.push(request.params.message);
        return { action: "accept", content: { approve: true } };
      });
      await c.connect(new StreamableHTTPClientTransport(new URL(`${ts.url}/mcp`), { requestInit: { headers } }));
      return c;
    };
    const send = (c: Client): Promise<CallToolResult> =>
      c.callTool(
        { name: "send_file", arguments: { export_id: exportId }, _meta: { "bothy/conversation_id": conversation } },
        undefined,
        { timeout: 120_000 },
      ) as Promise<CallToolResult>;

    // A person's client (a key with approvals:decide): the answer there is the decision.
    const person = await mint({ name: "person", scopes: ["sandboxes:write", "approvals:decide"] });
    const personal = await elicitingClient(as(person.key));
    try {
      const sent = await send(personal);
      expect(sent.isError, textOf(sent)).toBeFalsy();
      expect(asked).toHaveLength(1);
      expect(asked[0]).toContain("send_file");
      const row = (await ts.server.ledger.approvals.list({ sandboxId, limit: 1 }))[0];
      expect(row).toMatchObject({ state: "approved", decided_by: person.key_id, reason: "through MCP elicitation" });
    } finally {
      await personal.close();
    }

    // An agent's key (no approvals:decide), even with a client that could ask: it waits for a person.
    const agentKey = await mint({ name: "mcp-agent", scopes: ["sandboxes:write"] });
    const agent = await elicitingClient(as(agentKey.key));
    try {
      const sending = send(agent);
      const held = await pendingTool();
      expect(asked).toHaveLength(1);
      await api(ts.url, "POST", `/approvals/${held.approval_id}/approve`, {}, as(keys.decider));
      expect((await sending).isError).toBeFalsy();
      expect(asked).toHaveLength(1);
    } finally {
      await agent.close();
    }
  });
});
