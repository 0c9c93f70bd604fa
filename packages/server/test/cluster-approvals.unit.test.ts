/**
 * Approvals across nodes on a real PostgreSQL 15: two brokers on two stores of one database, as two
 * nodes hold them. A caller held on node X is answered by a decision made through node Y, once; two
 * nodes deciding at once give one outcome; a node that missed the notification learns from its
 * poll; a restart of one node cancels only its own held approvals. Every wait has a deadline.
 */
import { BothyError } from "@bothy/protocol";
import { afterAll, describe, expect, it } from "vitest";
import type { ServerEvent } from "../src/events/server-events.ts";
import { ApprovalBroker } from "../src/gateway/approvals.ts";
import type { ApprovalAsk, ApprovalOutcome } from "../src/gateway/contracts.ts";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { useStores } from "./helpers/stores.ts";

const stores = useStores();
const opened: LedgerStore[] = [];
const brokers: ApprovalBroker[] = [];
let databases = 0;
afterAll(async () => {
  for (const b of brokers) b.stop();
  await Promise.all(opened.map((s) => s.close()));
});

const ask: ApprovalAsk = {
  tenant: "default",
  sandboxId: "sbx_aaaaaaaaaaaaaaaaaaaa",
  conversationId: null,
  kind: "http",
  method: "POST",
  host: "api.example.com",
  path: "/v1/things",
  tool: null,
  excerpt: "{}",
  rule: "sandbox#0",
};

interface Node {
  broker: ApprovalBroker;
  events: ServerEvent[];
  store: LedgerStore;
}

/** Two nodes' stores on one fresh database. */
async function twoStores(): Promise<[LedgerStore, LedgerStore]> {
  const url = await stores.postgres().createDatabase(`approvals_${++databases}`);
  const a = await openStore({ databaseUrl: url, sqlitePath: "" });
  const b = await openStore({ databaseUrl: url, sqlitePath: "" });
  opened.push(a, b);
  return [a, b];
}

function node(store: LedgerStore, nodeId: string, opts: { deaf?: boolean; timeoutMs?: number } = {}): Node {
  const events: ServerEvent[] = [];
  const broker = new ApprovalBroker({
    rows: store.approvals,
    timeoutMs: opts.timeoutMs ?? 60_000,
    log: (event, fields) => events.push({ event, ...fields } as ServerEvent),
    // A deaf node hears no notification: only its poll tells it.
    cluster: { nodeId, listen: opts.deaf ? () => () => undefined : store.listen },
  });
  brokers.push(broker);
  return { broker, events, store };
}

/** Holds a caller on `on`; answers its outcome (a promise) and the approval's id once it is pending. */
async function hold(on: Node): Promise<{ id: string; outcome: Promise<ApprovalOutcome>; answers: ApprovalOutcome[] }> {
  const answers: ApprovalOutcome[] = [];
  let requested: (id: string) => void = () => undefined;
  const id = new Promise<string>((resolve) => (requested = resolve));
  const outcome = on.broker.ask(ask, new AbortController().signal, requested).then((o) => {
    answers.push(o);
    return o;
  });
  return { id: await id, outcome, answers };
}

const decided = (n: Node) => n.events.filter((e) => e.event === "approval_decided");

async function codeOf(p: Promise<unknown>): Promise<string | undefined> {
  return p.then(
    () => undefined,
    (err: unknown) => (err instanceof BothyError ? err.code : String(err)),
  );
}

describe("approvals across nodes (PostgreSQL)", { timeout: 60_000 }, () => {
  it("a caller held on node X is answered once by an approval made through node Y", async () => {
    const [a, b] = await twoStores();
    const x = node(a, "node-x");
    const y = node(b, "node-y");
    const held = await hold(x);
    expect(x.broker.held).toBe(1);
    const info = await y.broker.approve(held.id, { grant: "once" }, "key_person");
    expect(info.state).toBe("approved");
    expect(await held.outcome).toEqual({ approvalId: held.id, state: "approved" });
    expect(x.broker.held).toBe(0);
    // The decision is told once, by the node that made it.
    expect(decided(y)).toHaveLength(1);
    expect(decided(x)).toHaveLength(0);
    // A second decision, through either node, finds it decided and changes nothing.
    expect(await codeOf(x.broker.deny(held.id, undefined, "key_other"))).toBe("approval_not_pending");
    expect(await codeOf(y.broker.approve(held.id, { grant: "once" }, "key_other"))).toBe("approval_not_pending");
    expect(held.answers).toHaveLength(1);
  });

  it("a denial through Y reaches X's caller with its reason", async () => {
    const [a, b] = await twoStores();
    const x = node(a, "node-x");
    const y = node(b, "node-y");
    const held = await hold(x);
    await y.broker.deny(held.id, "not this one", "key_person");
    expect(await held.outcome).toEqual({ approvalId: held.id, state: "denied", reason: "not this one" });
  });

  it("two nodes deciding at once give one outcome, and the caller gets that one", async () => {
    const [a, b] = await twoStores();
    const x = node(a, "node-x");
    const y = node(b, "node-y");
    for (let round = 0; round < 5; round++) {
      const held = await hold(x);
      const [approved, denied] = await Promise.allSettled([
        x.broker.approve(held.id, { grant: "once" }, "key_x"),
        y.broker.deny(held.id, undefined, "key_y"),
      ]);
      const winners = [approved, denied].filter((r) => r.status === "fulfilled");
      expect(winners).toHaveLength(1);
      const loser = [approved, denied].find((r) => r.status === "rejected");
      expect((loser?.reason as BothyError).code).toBe("approval_not_pending");
      const outcome = await held.outcome;
      expect(outcome.state).toBe(approved.status === "fulfilled" ? "approved" : "denied");
      expect((await a.approvals.get(held.id))?.state).toBe(outcome.state);
    }
    expect(decided(x).length + decided(y).length).toBe(5);
  });

  it("a node that missed the notification learns of the decision from its poll", async () => {
    const [a, b] = await twoStores();
    const x = node(a, "node-x", { deaf: true });
    const y = node(b, "node-y");
    const held = await hold(x);
    await y.broker.approve(held.id, { grant: "once" }, "key_person");
    expect(await held.outcome).toMatchObject({ state: "approved" });
  });

  it("X's own expiry losing to Y's approval answers the caller with the approval", async () => {
    const [a, b] = await twoStores();
    // X's timer fires at once; Y's approval lands first (X is deaf, so only the lost compare-and-set tells it).
    const x = node(a, "node-x", { deaf: true, timeoutMs: 1_500 });
    const y = node(b, "node-y");
    const held = await hold(x);
    await y.broker.approve(held.id, { grant: "once" }, "key_person");
    expect(await held.outcome).toMatchObject({ state: "approved" });
    expect(decided(x)).toHaveLength(0);
  });

  it("a restart of node Y cancels Y's held approvals only; X's caller still waits for its decision", async () => {
    const [a, b] = await twoStores();
    const x = node(a, "node-x");
    const y = node(b, "node-y");
    const onX = await hold(x);
    const onY = await hold(y);
    // Y's process dies (its waiter with it) and Y starts again on the same database.
    const restarted = node(b, "node-y");
    expect(await restarted.broker.recover()).toBe(1);
    expect((await b.approvals.get(onY.id))?.state).toBe("cancelled");
    expect((await b.approvals.get(onX.id))?.state).toBe("pending");
    await restarted.broker.approve(onX.id, { grant: "once" }, "key_person");
    expect(await onX.outcome).toMatchObject({ state: "approved" });
    // The old process's caller on Y heard of the cancellation too (it had not really died here).
    expect(await onY.outcome).toMatchObject({ state: "cancelled", cancelReason: "server_restarted" });
  });
});
