/**
 * Nothing held outlives the server (gVisor, a real `bothy serve`): a tool call held for approval
 * ends `cancelled` (server_stopping) on a graceful stop, and after a SIGKILL the next start cancels
 * what was pending (server_restarted), so a late approval finds nothing to let through.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { ApprovalInfo } from "@bothy/protocol";
import { afterAll, describe, expect, it } from "vitest";
import { readEventStream } from "./helpers/background.ts";
import { api } from "./helpers/client.ts";
import { driverTitle, testDriver } from "./helpers/drivers.ts";
import { hostLeaks, noLeaks } from "./helpers/host-state.ts";
import { spawnTestServe, type ServeProcess } from "./helpers/serve-process.ts";

const gvisor = testDriver("gvisor");

describe.skipIf(gvisor.missing !== undefined)(driverTitle(gvisor, "approvals across a stop and a SIGKILL"), () => {
  let home = "";
  let serve: ServeProcess | undefined;

  afterAll(async () => {
    if (!home) return;
    // After a failure, a server on the home takes over what a killed one left, and its stop ends it.
    const child = serve?.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) await start();
    await serve?.stop();
    await rm(home, { recursive: true, force: true });
  }, 180_000);

  function start(): Promise<string> {
    serve = spawnTestServe(home, { BOTHY_DRIVER: "gvisor" });
    return serve.url;
  }

  /** Calls send_file in the conversation over a new MCP session; the call is held (or fails when the server goes). */
  async function heldCall(base: string): Promise<{ client: Client; result: Promise<unknown> }> {
    const client = new Client({ name: "approvals-restart", version: "1" });
    await client.connect(new StreamableHTTPClientTransport(new URL(`${base}/mcp`)));
    const result = client
      .callTool(
        { name: "send_file", arguments: { export_id: "exp_none" }, _meta: { "bothy/conversation_id": "conv-r" } },
        undefined,
        { timeout: 120_000 },
      )
      .catch((err: unknown) => err);
    return { client, result };
  }

  async function pending(base: string): Promise<ApprovalInfo> {
    for (;;) {
      const listed = (await api(base, "GET", "/approvals?state=pending")).json["approvals"] as ApprovalInfo[];
      if (listed[0]) return listed[0];
      await new Promise((r) => setTimeout(r, 20)); // the poll's pace, not a wait for an outcome
    }
  }

  it("cancels a held tool call on a graceful stop and what a SIGKILL left pending at the next start", async () => {
    home = await mkdtemp("/tmp/bothy-test-approvals-");
    let base = await start();
    const created = await api(base, "POST", "/sandboxes", {
      template: "seed",
      memory_mib: 256,
      policy: { tools: { send_file: "ask" } },
    });
    expect(created.status, JSON.stringify(created.json)).toBe(201);
    const sandboxId = String(created.json["sandbox_id"]);
    expect(
      (await api(base, "POST", "/conversations", { conversation_id: "conv-r", sandbox_id: sandboxId })).status,
    ).toBe(201);

    // SIGKILL while held: the row stays pending in the ledger until the next start cancels it.
    const killed = await heldCall(base);
    const first = await pending(base);
    await serve?.kill();
    // The client's transport does not notice a dead server by itself: closing it ends the call.
    await killed.client.close();
    await killed.result;
    base = await start();
    expect((await api(base, "GET", `/approvals/${first.approval_id}`)).json).toMatchObject({
      state: "cancelled",
      reason: "server_restarted",
      decided_by: null,
    });
    const late = await api(base, "POST", `/approvals/${first.approval_id}/approve`, {});
    expect([late.status, late.json["code"]]).toEqual([409, "approval_not_pending"]);
    const events = await readEventStream(base, "?since=0", (evs) =>
      evs.some((e) => e.type === "approval.decided" && e.data["approval_id"] === first.approval_id),
    );
    expect(events.filter((e) => e.data["approval_id"] === first.approval_id).map((e) => e.type)).toEqual([
      "approval.requested",
      "approval.decided",
    ]);

    // A graceful stop answers the held call and records why.
    const stopped = await heldCall(base);
    const second = await pending(base);
    await serve?.stop();
    await stopped.client.close();
    await stopped.result;
    base = await start();
    expect((await api(base, "GET", `/approvals/${second.approval_id}`)).json).toMatchObject({
      state: "cancelled",
      reason: "server_stopping",
    });
    expect((await api(base, "GET", "/approvals?state=pending")).json["approvals"]).toEqual([]);

    expect((await api(base, "DELETE", `/conversations/conv-r`)).status).toBe(200);
    await serve?.stop();
    expect(await hostLeaks(home)).toEqual(noLeaks());
    await rm(home, { recursive: true, force: true });
    home = "";
  }, 300_000);
});
