/**
 * Who owns a sandbox in a cluster, with real `bothy serve` nodes on one PostgreSQL 15 and real
 * gVisor sandboxes, from the side of a node that failed: one killed with SIGKILL, whose sandboxes
 * the other node must show `stopped` (and not start: their disks are on the dead node) until it
 * restarts and takes them back; one stopped with SIGSTOP past its lease, whose write when it wakes
 * must be refused while its successor's stands, and which must then leave the sandbox to the
 * successor; and the leader killed, whose periodic work another node must take over. Leases are
 * 3 s (the shortest BOTHY_NODE_LEASE_S takes); every wait polls with a deadline.
 */
import { cp, mkdtemp, readFile, rm } from "node:fs/promises";
import http from "node:http";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { api, deleteSandbox, pollUntil, runCommand } from "./helpers/client.ts";
import { driverTitle, testDriver } from "./helpers/drivers.ts";
import { startPostgres, type TestPostgres } from "./helpers/postgres.ts";
import { spawnTestServe, type ServeProcess } from "./helpers/serve-process.ts";

const driver = testDriver("gvisor");
const LEASE_MS = 3000;
/** Long enough for a node to take a lapsed lease and recover under this box's load; never a timing assertion. */
const DEADLINE_MS = LEASE_MS * 10;

interface Node {
  home: string;
  serve: ServeProcess;
  base: string;
  /** Its node id (kept in its home). */
  id: string;
}

/**
 * A POST whose headers the server has read (it answered 100 Continue, so the request's `onRequest`
 * checks have run) and whose body waits for `send`: a write that a node has begun serving when it is
 * paused, and carries out when it wakes.
 */
async function heldPost(
  base: string,
  path: string,
  body: unknown,
): Promise<{ send: () => Promise<{ status: number; code: unknown }> }> {
  const data = Buffer.from(JSON.stringify(body));
  const req = http.request(`${base}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", "content-length": String(data.length), expect: "100-continue" },
  });
  const closed = { status: 0, code: "connection closed" };
  const answer = new Promise<{ status: number; code: unknown }>((resolve) => {
    req.on("error", () => resolve(closed));
    req.on("response", (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => (text += chunk));
      res.on("error", () => resolve(closed));
      res.on("end", () =>
        resolve({
          status: res.statusCode ?? 0,
          code: text ? (JSON.parse(text) as { code?: unknown }).code : undefined,
        }),
      );
    });
  });
  await new Promise<void>((resolve, reject) => {
    req.once("continue", resolve);
    req.once("error", reject);
    req.flushHeaders();
  });
  return {
    send: () => {
      req.end(data);
      return answer;
    },
  };
}

describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "sandboxes' owners in a cluster"), () => {
  let postgres: TestPostgres | undefined;
  let databases = 0;
  let url = "";
  let store: LedgerStore | undefined;
  const homes: string[] = [];
  const nodes: Node[] = [];
  /** Sandboxes to delete after the test, with the node that ends up owning them. */
  const made: Array<{ id: string; node: () => Node }> = [];

  const db = (): LedgerStore => {
    if (!store) throw new Error("no database");
    return store;
  };

  async function startNode(home: string, env: Record<string, string> = {}): Promise<Node> {
    const serve = spawnTestServe(home, {
      BOTHY_DRIVER: "gvisor",
      BOTHY_DATABASE_URL: url,
      BOTHY_NODE_URL: "http://127.0.0.1:1",
      BOTHY_NODE_LEASE_S: String(LEASE_MS / 1000),
      ...env,
    });
    const base = await serve.url;
    const node = { home, serve, base, id: (await readFile(join(home, "node-id"), "utf8")).trim() };
    nodes.push(node);
    return node;
  }

  /** A home of its own; another node's gets that node's secrets (the API keys' pepper, the vault key), as the README says. */
  async function newHome(peer?: Node): Promise<string> {
    const home = await mkdtemp("/tmp/bothy-test-owner-");
    homes.push(home);
    if (peer) await cp(join(peer.home, "secrets"), join(home, "secrets"), { recursive: true });
    return home;
  }

  async function create(node: Node, body: Record<string, unknown> = {}): Promise<string> {
    const res = await api(node.base, "POST", "/sandboxes", { template: "seed", vcpu: 1, memory_mib: 512, ...body });
    expect(res.status, JSON.stringify(res.json)).toBe(201);
    return String(res.json["sandbox_id"]);
  }

  const stateVia = async (node: Node, id: string): Promise<unknown> =>
    (await api(node.base, "GET", `/sandboxes/${id}`)).json["state"];

  const echo = async (node: Node, id: string, text: string): Promise<string> =>
    (await runCommand(node.base.replace(/^http/, "ws"), id, { cmd: `echo ${text}` })).stdout;

  const exitCode = (serve: ServeProcess): Promise<number | null> =>
    serve.child.exitCode !== null || serve.child.signalCode !== null
      ? Promise.resolve(serve.child.exitCode)
      : new Promise((resolve) => serve.child.once("exit", (code) => resolve(code)));

  beforeAll(async () => {
    postgres = await startPostgres();
  }, 120_000);

  afterEach(async () => {
    for (const { id, node } of made.splice(0))
      await deleteSandbox(node().base, id).catch((err: unknown) => console.error(`cleanup of ${id}: ${String(err)}`));
    for (const node of nodes.splice(0)) {
      node.serve.child.kill("SIGCONT");
      await node.serve.stop();
    }
    await store?.close();
    store = undefined;
    for (const home of homes.splice(0)) await rm(home, { recursive: true, force: true });
  });

  afterAll(async () => {
    await postgres?.stop();
  });

  async function freshDatabase(): Promise<void> {
    if (!postgres) throw new Error("no PostgreSQL");
    url = await postgres.createDatabase(`owner_${++databases}`);
    store = await openStore({ databaseUrl: url, sqlitePath: "", poolSize: 2 });
  }

  it(
    "a node killed with SIGKILL: its sandbox shows stopped through the other node within one lease, is not started there, and answers again once the node restarts",
    { timeout: 240_000 },
    async () => {
      await freshDatabase();
      const a = await startNode(await newHome());
      const b = await startNode(await newHome(a));
      const id = await create(a);
      let owner = a;
      made.push({ id, node: () => owner });
      expect(await echo(a, id, "before")).toBe("before\n");
      expect(await stateVia(b, id)).toBe("running");

      await a.serve.kill();
      const killedAt = await db().nodes.now();
      // Its last renewal came before the kill, so by the database's clock its lease ends within one lease of it.
      const row = (await db().nodes.nodes()).find((n) => n.id === a.id);
      expect(row?.lease_expires_at).toBeLessThanOrEqual(killedAt + LEASE_MS);
      await pollUntil(
        "the sandbox to show stopped through the other node",
        async () => (await stateVia(b, id)) === "stopped",
        DEADLINE_MS,
      );
      const listed = (await api(b.base, "GET", "/sandboxes")).json["sandboxes"] as Array<Record<string, unknown>>;
      expect(listed.find((s) => s["sandbox_id"] === id)).toMatchObject({ state: "stopped" });
      // The other node does not start it (its disk is on the dead node): a refusal that says where it lives.
      const woken = await api(b.base, "POST", `/sandboxes/${id}/resume`);
      expect([woken.status, woken.json["code"]]).toEqual([409, "sandbox_not_running"]);
      expect(String(woken.json["detail"])).toContain(a.id);
      // The row itself is as the dead node left it: readers see it stopped.
      expect(await db().getSandbox(id)).toMatchObject({ state: "running", node_id: a.id, node_epoch: 1 });

      const restarted = await startNode(a.home);
      owner = restarted;
      expect(restarted.id).toBe(a.id);
      expect(await db().getSandbox(id)).toMatchObject({ node_id: a.id, node_epoch: 2 });
      await pollUntil(
        "the sandbox to run again through the other node",
        async () => (await stateVia(b, id)) === "running",
        DEADLINE_MS,
      );
      expect(await echo(restarted, id, "after")).toBe("after\n");
    },
  );

  it(
    "a node stopped past its lease cannot write when it wakes: its successor's write stands, and it exits leaving the sandbox to the successor",
    { timeout: 240_000 },
    async () => {
      await freshDatabase();
      const home = await newHome();
      const first = await startNode(home);
      const id = await create(first);
      let owner = first;
      made.push({ id, node: () => owner });
      expect(await echo(first, id, "first")).toBe("first\n");

      // A write the node has begun to serve when it is paused.
      const late = await heldPost(first.base, `/sandboxes/${id}/timeout`, { timeout_s: 1200 });
      first.serve.child.kill("SIGSTOP");
      await pollUntil(
        "the paused node's lease to lapse",
        async () => (await db().nodes.nodes()).some((n) => n.id === first.id && n.lapsed),
        DEADLINE_MS,
      );
      // Its successor: the same node (its home), restarted while the old process is still paused.
      const successor = await startNode(home);
      owner = successor;
      expect(await db().getSandbox(id)).toMatchObject({ node_id: first.id, node_epoch: 2 });
      const set = await api(successor.base, "POST", `/sandboxes/${id}/timeout`, { timeout_s: 600 });
      expect(set.status, JSON.stringify(set.json)).toBe(200);
      const stands = (await db().getSandbox(id))?.expires_at;

      // The paused node wakes with that write's body waiting for it, still believing it holds epoch 1.
      const answered = late.send();
      first.serve.child.kill("SIGCONT");
      // Refused; or, should it have closed its connections first, never carried out (the row says which).
      const answer = await answered;
      expect(
        answer.status === 0 || (answer.status === 503 && answer.code === "lease_lost"),
        JSON.stringify(answer),
      ).toBe(true);
      // It stops serving and exits for a restart (EX_TEMPFAIL), touching nothing of the sandbox.
      expect(await exitCode(first.serve)).toBe(75);
      expect(first.serve.logs.some((l) => l["event"] === "node_lease_lost")).toBe(true);
      expect((await db().getSandbox(id))?.expires_at).toBe(stands);
      expect(await db().getSandbox(id)).toMatchObject({ state: "running", node_epoch: 2 });
      expect(await echo(successor, id, "successor")).toBe("successor\n");
    },
  );

  it(
    "the leader killed: another node leads within a lease and meters the cluster, and an expired sandbox is still deleted",
    { timeout: 240_000 },
    async () => {
      await freshDatabase();
      const fast = { BOTHY_SWEEP_INTERVAL_S: "1", BOTHY_METER_INTERVAL_S: "0.5" };
      const one = await startNode(await newHome(), fast);
      const pair = [one, await startNode(await newHome(one), fast)];
      const leaderNow = async (): Promise<{ node: Node; epoch: number } | undefined> => {
        const lease = await db().clusterLeases.lease("leader");
        const node = pair.find((n) => lease?.holder === `${n.id}/${n.serve.child.pid}`);
        return lease && !lease.lapsed && node ? { node, epoch: lease.epoch } : undefined;
      };
      let first: { node: Node; epoch: number } | undefined;
      await pollUntil("a leader", async () => (first = await leaderNow()) !== undefined, DEADLINE_MS);
      if (!first) throw new Error("no leader");
      const other = pair.find((n) => n !== first?.node);
      if (!other) throw new Error("no second node");
      // On the node that survives, with a timeout that ends after the leader is gone.
      const id = await create(other, { timeout_s: 20 });
      made.push({ id, node: () => other });

      await first.node.serve.kill();
      let second: { node: Node; epoch: number } | undefined;
      await pollUntil(
        "the other node to lead",
        async () => (second = await leaderNow()) !== undefined && second.node === other,
        DEADLINE_MS,
      );
      // Its usage job meters the sandbox from its second run on.
      const usage = async (): Promise<number> => (await db().sandboxUsage(id))?.vcpu_seconds ?? 0;
      const before = await usage();
      await pollUntil("the new leader to meter the sandbox", async () => (await usage()) > before, DEADLINE_MS);
      await pollUntil(
        "the expired sandbox to be deleted",
        async () => (await stateVia(other, id)) === "deleted",
        60_000,
      );
      made.splice(0);
    },
  );
});
