/**
 * The approval broker on a real (temporary) ledger: a decision lands once and releases the held
 * caller once; deny, expiry, a caller gone, a graceful stop and a restart each end an approval
 * with its own state; a `host` grant lasts across a restart.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { APPROVAL_ID_RE, BothyError } from "@bothy/protocol";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ApprovalBroker, EXCERPT_BYTES, excerptOf } from "../src/gateway/approvals.ts";
import type { ApprovalAsk } from "../src/gateway/contracts.ts";
import type { ServerEvent } from "../src/events/server-events.ts";
import { toPublicEvent } from "../src/events/public-events.ts";
import { signature } from "../src/events/webhook.ts";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { effectivePolicy } from "../src/gateway/host-policy.ts";
import { toolGate } from "../src/gateway/tool-gate.ts";

const SBX = "sbx_aaaaaaaaaaaaaaaaaaaa";

const httpAsk = (over: Partial<ApprovalAsk> = {}): ApprovalAsk => ({
  tenant: "default",
  sandboxId: SBX,
  conversationId: null,
  kind: "http",
  method: "POST",
  host: "api.example.com",
  path: "/v1/things",
  tool: null,
  excerpt: '{"name":"x"}',
  rule: "sandbox#0",
  ...over,
});

let dir: string;
let ledger: LedgerStore;
let events: ServerEvent[];

function broker(timeoutMs = 60_000, on: LedgerStore = ledger): ApprovalBroker {
  return new ApprovalBroker({
    rows: on.approvals,
    timeoutMs,
    log: (event, fields) => events.push({ event, ...fields } as ServerEvent),
  });
}

/** Approvals announced so far that `lastRequested` answered for. */
let seen = 0;

/** The id of the approval the broker announced last, once one more than before was (its row is written first). */
async function lastRequested(): Promise<string> {
  for (let tick = 0; tick < 10_000; tick++) {
    const all = events.filter((e) => e.event === "approval_requested");
    const ev = all.at(-1);
    if (all.length > seen && ev?.event === "approval_requested") {
      seen = all.length;
      return ev.approval_id;
    }
    await new Promise((resolve) => setImmediate(resolve));
  }
  throw new Error("no approval requested");
}

async function code(fn: () => Promise<unknown>): Promise<string | undefined> {
  try {
    await fn();
  } catch (err) {
    return err instanceof BothyError ? err.code : String(err);
  }
  return undefined;
}

beforeEach(async () => {
  seen = 0;
  dir = await mkdtemp(join(tmpdir(), "bothy-approvals-"));
  ledger = await openStore({ sqlitePath: join(dir, "ledger.sqlite") });
  events = [];
});

afterEach(async () => {
  await ledger.close();
  await rm(dir, { recursive: true, force: true });
});

describe("approval broker", () => {
  it("writes a pending row and announces it, then releases the caller once on approve", async () => {
    const b = broker();
    const held = b.ask(httpAsk(), new AbortController().signal);
    const id = await lastRequested();
    expect(id).toMatch(APPROVAL_ID_RE);
    const row = await b.get(id);
    expect(row).toMatchObject({ state: "pending", host: "api.example.com", method: "POST", kind: "http" });
    expect(Date.parse(row?.expires_at ?? "") - Date.parse(row?.created_at ?? "")).toBe(60_000);
    expect(b.held).toBe(1);

    const approved = await b.approve(id, { grant: "once" }, "key_decider");
    expect(approved).toMatchObject({
      state: "approved",
      decided_by: "key_decider",
      grant: { kind: "once", until: null },
    });
    expect(await held).toEqual({ approvalId: id, state: "approved" });
    expect(await code(() => b.approve(id, { grant: "once" }, "key_other"))).toBe("approval_not_pending");
    expect(await code(() => b.deny(id, undefined, "key_other"))).toBe("approval_not_pending");
    expect((await ledger.approvals.get(id))?.decided_by).toBe("key_decider");
    expect(events.filter((e) => e.event === "approval_decided")).toHaveLength(1);
    expect(b.held).toBe(0);
  });

  it("denies with the decider's reason", async () => {
    const b = broker();
    const held = b.ask(httpAsk(), new AbortController().signal);
    const id = await lastRequested();
    expect(await b.deny(id, "not today", "key_x")).toMatchObject({ state: "denied", reason: "not today" });
    expect(await held).toEqual({ approvalId: id, state: "denied", reason: "not today" });
  });

  it("expires when nobody decides in time", async () => {
    const b = broker(20);
    const outcome = await b.ask(httpAsk(), new AbortController().signal);
    expect(outcome.state).toBe("expired");
    expect((await ledger.approvals.get(outcome.approvalId))?.state).toBe("expired");
    expect(await code(() => b.approve(outcome.approvalId, { grant: "once" }, null))).toBe("approval_not_pending");
  });

  it("cancels when the caller goes away, and when it was gone before asking", async () => {
    const b = broker();
    const gone = new AbortController();
    const held = b.ask(httpAsk(), gone.signal);
    gone.abort();
    expect(await held).toMatchObject({ state: "cancelled", cancelReason: "client_gone" });
    const already = await b.ask(httpAsk(), AbortSignal.abort());
    expect(already).toMatchObject({ state: "cancelled", cancelReason: "client_gone" });
    expect(await ledger.approvals.get(already.approvalId)).toMatchObject({ state: "cancelled", reason: "client_gone" });
  });

  it("answers every held caller on a graceful stop, and asks after it at once", async () => {
    const b = broker();
    const held = [b.ask(httpAsk(), new AbortController().signal), b.ask(httpAsk(), new AbortController().signal)];
    b.stop();
    for (const outcome of await Promise.all(held))
      expect(outcome).toMatchObject({ state: "cancelled", cancelReason: "server_stopping" });
    expect(b.held).toBe(0);
    expect(await b.ask(httpAsk(), new AbortController().signal)).toMatchObject({
      state: "cancelled",
      cancelReason: "server_stopping",
    });
  });

  it("cancels what a previous process left pending, so a late approval sends nothing", async () => {
    const before = broker();
    void before.ask(httpAsk(), new AbortController().signal);
    const id = await lastRequested();
    // The process dies: its waiter is gone with it; a new broker starts on the same ledger.
    await ledger.close();
    ledger = await openStore({ sqlitePath: join(dir, "ledger.sqlite") });
    const after = broker();
    expect(await after.recover()).toBe(1);
    expect(await ledger.approvals.get(id)).toMatchObject({ state: "cancelled", reason: "server_restarted" });
    expect(await code(() => after.approve(id, { grant: "once" }, null))).toBe("approval_not_pending");
    const decided = events.filter((e) => e.event === "approval_decided");
    expect(decided.at(-1)).toMatchObject({ approval_id: id, state: "cancelled", reason: "server_restarted" });
  });

  it("grants a host for N minutes, across a restart, to that sandbox only", async () => {
    const b = broker();
    expect(await b.granted(SBX, "api.example.com")).toBe(false);
    const held = b.ask(httpAsk({ host: "API.example.com." }), new AbortController().signal);
    const id = await lastRequested();
    expect(await code(() => b.approve(id, { grant: "host" }, null))).toBe("invalid_request");
    expect(await code(() => b.approve(id, { grant: "once", minutes: 5 }, null))).toBe("invalid_request");
    const approved = await b.approve(id, { grant: "host", minutes: 5 }, "key_x");
    expect(Date.parse(approved.grant?.until ?? "")).toBeGreaterThan(Date.now() + 4 * 60_000);
    expect((await held).state).toBe("approved");
    expect(await b.granted(SBX, "api.example.com")).toBe(true);
    expect(await b.granted(SBX, "other.example.com")).toBe(false);
    expect(await b.granted("sbx_bbbbbbbbbbbbbbbbbbbb", "api.example.com")).toBe(false);
    await ledger.close();
    ledger = await openStore({ sqlitePath: join(dir, "ledger.sqlite") });
    expect(await broker().granted(SBX, "api.example.com")).toBe(true);
  });

  it("refuses a host grant for a tool, and an unknown id", async () => {
    const b = broker();
    const held = b.ask(
      httpAsk({ kind: "tool", method: null, host: null, path: null, tool: "send_file", rule: "tools.send_file" }),
      new AbortController().signal,
    );
    const id = await lastRequested();
    expect(await code(() => b.approve(id, { grant: "host", minutes: 5 }, null))).toBe("invalid_request");
    expect(await code(() => b.approve("apr_aaaaaaaaaaaaaaaaaaaa", { grant: "once" }, null))).toBe("approval_not_found");
    await b.approve(id, { grant: "once" }, null);
    expect((await held).state).toBe("approved");
  });

  it("lists newest first, by tenant, state and sandbox", async () => {
    const b = broker();
    void b.ask(httpAsk(), new AbortController().signal);
    const first = await lastRequested();
    void b.ask(httpAsk({ tenant: "t2", sandboxId: "sbx_bbbbbbbbbbbbbbbbbbbb" }), new AbortController().signal);
    const second = await lastRequested();
    await b.deny(first, undefined, null);
    expect((await b.list({ limit: 10 })).map((a) => a.approval_id)).toEqual([second, first]);
    expect((await b.list({ tenant: "default", limit: 10 })).map((a) => a.approval_id)).toEqual([first]);
    expect((await b.list({ state: "pending", limit: 10 })).map((a) => a.approval_id)).toEqual([second]);
    expect((await b.list({ sandboxId: SBX, limit: 10 })).map((a) => a.approval_id)).toEqual([first]);
    b.stop();
  });

  it("cuts an excerpt to 8 KiB between characters", async () => {
    const long = "é".repeat(EXCERPT_BYTES);
    const cut = excerptOf(long);
    expect(Buffer.byteLength(cut)).toBeLessThanOrEqual(EXCERPT_BYTES);
    expect(cut).toBe("é".repeat(EXCERPT_BYTES / 2));
    expect(excerptOf("short")).toBe("short");
  });

  it("become public events of the approval's tenant", async () => {
    const b = broker();
    void b.ask(httpAsk({ tenant: "t2" }), new AbortController().signal);
    const requestedId = await lastRequested();
    const requested = events.find((e) => e.event === "approval_requested");
    if (!requested) throw new Error("no event");
    expect(toPublicEvent(requested)).toMatchObject({
      type: "approval.requested",
      sandboxId: SBX,
      tenant: "t2",
      data: { approval_id: requestedId, host: "api.example.com", excerpt: '{"name":"x"}' },
    });
    const held = b.ask(httpAsk({ tenant: "t2" }), new AbortController().signal);
    await lastRequested();
    b.stop();
    await held; // answered once its row is settled (and `approval_decided` told)
    const decided = events.find((e) => e.event === "approval_decided");
    if (!decided) throw new Error("no event");
    expect(toPublicEvent(decided)).toMatchObject({ type: "approval.decided", data: { state: "cancelled" } });
  });

  it("signs a webhook body as t=<seconds>,v1=<hex HMAC of t.body>", async () => {
    const at = new Date("2026-12-01T00:00:00Z");
    expect(signature("0123456789abcdef", '{"a":1}', at)).toMatch(/^t=1796083200,v1=[0-9a-f]{64}$/);
  });
});

describe("tool gate", () => {
  const policy = effectivePolicy(undefined, { tools: { send_file: "ask", computer_bash: "deny" } });
  const tenantOnly = effectivePolicy({ tools: { rag_search: "deny" } }, undefined);
  const gateWith = (b: ApprovalBroker) =>
    toolGate("default", {
      approvals: b,
      policyOf: async (id) => (id === SBX ? policy : undefined),
      tenantPolicy: async () => tenantOnly,
    });
  const call = (tool: string, knownSandboxId: string | null = SBX) => ({
    tool,
    conversationId: "conv-1",
    args: { export_id: "exp_1" },
    knownSandboxId,
    sandboxId: async () => SBX,
    caller: undefined,
    askUser: async () => undefined,
  });

  it("lets allowed tools run, refuses denied ones naming the rule", async () => {
    const gate = gateWith(broker());
    expect(await gate(call("computer_read_file"), new AbortController().signal)).toBeUndefined();
    const refused = await gate(call("computer_bash"), new AbortController().signal);
    expect(refused).toMatchObject({ code: "policy_denied" });
    expect(refused?.message).toContain("tools.computer_bash");
    // No sandbox yet: the tenant's default decides.
    expect(await gate(call("rag_search", null), new AbortController().signal)).toMatchObject({ code: "policy_denied" });
    expect(await gate(call("computer_bash", null), new AbortController().signal)).toBeUndefined();
  });

  it("holds an ask as a tool approval: approved runs, denied and expired do not", async () => {
    const b = broker();
    const gate = gateWith(b);
    const approved = gate(call("send_file"), new AbortController().signal);
    await lastRequested();
    const first = (await b.list({ state: "pending", limit: 1 }))[0];
    expect(first).toMatchObject({
      kind: "tool",
      tool: "send_file",
      rule: "tools.send_file",
      conversation_id: "conv-1",
    });
    expect(JSON.parse(first?.excerpt ?? "")).toEqual({ export_id: "exp_1" });
    await b.approve(first?.approval_id ?? "", { grant: "once" }, null);
    expect(await approved).toBeUndefined();

    const denied = gate(call("send_file"), new AbortController().signal);
    await b.deny(await lastRequested(), "no", null);
    expect(await denied).toMatchObject({ code: "not_approved" });

    const expired = await gateWith(broker(10))(call("send_file"), new AbortController().signal);
    expect(expired?.message).toContain("expired");
  });

  it("offers the question to the MCP client's user only when the caller could decide it", async () => {
    const b = broker();
    const gate = gateWith(b);
    const asked: string[] = [];
    const askUser = async (message: string): Promise<"approve"> => {
      asked.push(message);
      return "approve";
    };
    const decider = { keyId: "key_decider", scopes: ["sandboxes:write", "approvals:decide"] };
    expect(
      await gate({ ...call("send_file"), caller: decider, askUser }, new AbortController().signal),
    ).toBeUndefined();
    expect(asked).toHaveLength(1);
    expect(asked[0]).toContain("send_file");
    const row = await ledger.approvals.get(await lastRequested());
    expect(row).toMatchObject({ state: "approved", decided_by: "key_decider", reason: "through MCP elicitation" });

    // An agent's key: never asked; the call waits for a person over HTTP.
    const agent = { keyId: "key_agent", scopes: ["sandboxes:write"] };
    const held = gate({ ...call("send_file"), caller: agent, askUser }, new AbortController().signal);
    await b.approve(await lastRequested(), { grant: "once" }, "key_person");
    expect(await held).toBeUndefined();
    expect(asked).toHaveLength(1);
  });
});
