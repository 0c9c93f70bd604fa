/**
 * Several machines' leases on a real PostgreSQL 15, with real processes (fixtures/cluster-member.ts)
 * that the tests pause with SIGSTOP or kill with SIGKILL, from the side of a node that lost its
 * lease without knowing it: its writes, and its leader's job runs, must be refused once its lease
 * lapsed or passed to a successor, and a successor's must stand. Every wait polls the database with
 * a deadline; leases are 1.5 s so the file stays short.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { startPostgres, type TestPostgres } from "./helpers/postgres.ts";
import { startTestServer } from "./helpers/test-server.ts";

const LEASE_MS = 1500;
const JOB_MS = 200;
const FIXTURE = fileURLToPath(new URL("./fixtures/cluster-member.ts", import.meta.url));

type Line = Record<string, unknown> & { event: string };

interface Member {
  child: ChildProcess;
  lines: Line[];
  /** The first line (seen already or to come) after index `from` matching; rejects once the process's output ends. */
  next(event: string, match?: (line: Line) => boolean, from?: number): Promise<Line>;
  send(command: Record<string, unknown>): void;
  kill(signal: NodeJS.Signals): Promise<void>;
}

const members: Member[] = [];

function startMember(url: string, nodeId: string): Member {
  const child = spawn(process.execPath, ["--conditions=@bothy/source", "--import", "tsx", FIXTURE], {
    env: {
      ...process.env,
      BOTHY_DATABASE_URL: url,
      CLUSTER_NODE_ID: nodeId,
      CLUSTER_LEASE_MS: String(LEASE_MS),
      CLUSTER_JOB_MS: String(JOB_MS),
    },
    stdio: ["pipe", "pipe", "pipe"],
  });
  const lines: Line[] = [];
  const stderr: string[] = [];
  child.stderr?.setEncoding("utf8").on("data", (chunk: string) => {
    stderr.push(chunk);
    if (stderr.length > 50) stderr.shift();
  });
  let ended = false;
  const waiters = new Set<() => void>();
  const wake = (): void => {
    for (const w of waiters) w();
  };
  const rl = createInterface({ input: child.stdout! });
  rl.on("line", (text) => {
    lines.push(JSON.parse(text) as Line);
    wake();
  });
  rl.once("close", () => {
    ended = true;
    wake();
  });
  const member: Member = {
    child,
    lines,
    next: (event, match = () => true, from = 0) =>
      new Promise((resolve, reject) => {
        const check = (): void => {
          const found = lines.slice(from).find((l) => l.event === event && match(l));
          if (found) {
            waiters.delete(check);
            resolve(found);
          } else if (ended) {
            waiters.delete(check);
            reject(
              new Error(
                `${nodeId}'s output ended before ${event}: ${JSON.stringify(lines.slice(-5))} ${stderr.join("")}`,
              ),
            );
          }
        };
        waiters.add(check);
        check();
      }),
    send: (command) => void child.stdin?.write(`${JSON.stringify(command)}\n`),
    kill: async (signal) => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const gone = new Promise((resolve) => child.once("exit", resolve));
      child.kill(signal);
      if (signal === "SIGKILL" || signal === "SIGTERM") await gone;
    },
  };
  members.push(member);
  return member;
}

/** Polls `probe` until it answers a value, failing after `ms`. */
async function until<T>(what: string, probe: () => Promise<T | undefined>, ms = LEASE_MS * 8): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

let postgres: TestPostgres;
const stores: LedgerStore[] = [];
let databases = 0;

async function freshDatabase(): Promise<{ url: string; store: LedgerStore }> {
  const url = await postgres.createDatabase(`cluster_${++databases}`);
  const store = await openStore({ databaseUrl: url, sqlitePath: "", poolSize: 2 });
  stores.push(store);
  return { url, store };
}

beforeAll(async () => {
  postgres = await startPostgres();
}, 120_000);

afterEach(async () => {
  // A stopped member must be continued for SIGKILL's exit to be reaped at once.
  for (const m of members.splice(0)) {
    m.child.kill("SIGCONT");
    await m.kill("SIGKILL");
  }
});

afterAll(async () => {
  await Promise.all(stores.map((s) => s.close()));
  await postgres?.stop();
});

describe("node leases and fencing (PostgreSQL, real processes)", () => {
  it("a node paused past its lease cannot write when it wakes: its successor took the lease, and the successor's write stands", async () => {
    const { url, store } = await freshDatabase();
    const first = startMember(url, "node-a");
    expect((await first.next("node")).epoch).toBe(1);
    first.send({ op: "insert", id: "sbx_fencedfencedfenced1" });
    expect(await first.next("insert")).toMatchObject({ ok: true });
    first.send({ op: "write", id: "sbx_fencedfencedfenced1", value: "first-before-pause" });
    expect(await first.next("write")).toMatchObject({ ok: true });

    await first.kill("SIGSTOP");
    await until("node-a's lease to lapse", async () =>
      (await store.nodes.nodes()).find((n) => n.id === "node-a" && n.lapsed),
    );
    // Paused past its lease, its sandbox shows stopped to readers: its disk is on a node no one holds.
    expect(await store.nodes.seenSandbox("sbx_fencedfencedfenced1")).toMatchObject({
      state: "stopped",
      node_lapsed: true,
    });

    const successor = startMember(url, "node-a");
    expect((await successor.next("node")).epoch).toBe(2);
    expect(await store.getSandbox("sbx_fencedfencedfenced1")).toMatchObject({ node_id: "node-a", node_epoch: 2 });
    successor.send({ op: "write", id: "sbx_fencedfencedfenced1", value: "successor" });
    expect(await successor.next("write")).toMatchObject({ ok: true });

    // The paused one wakes with a write queued, still believing it holds epoch 1.
    const from = first.lines.length;
    first.send({ op: "write", id: "sbx_fencedfencedfenced1", value: "first-after-wake" });
    first.send({ op: "insert", id: "sbx_fencedfencedfenced2" });
    first.child.kill("SIGCONT");
    expect(await first.next("write", undefined, from)).toMatchObject({ ok: false, code: "lease_lost" });
    expect(await first.next("insert", undefined, from)).toMatchObject({ ok: false, code: "lease_lost" });
    expect(await first.next("node_lease_lost", undefined, from)).toMatchObject({ epoch: 1 });

    expect(await store.getSandbox("sbx_fencedfencedfenced1")).toMatchObject({ expires_at: "successor" });
    expect(await store.getSandbox("sbx_fencedfencedfenced2")).toBeUndefined();
    expect(await store.nodes.seenSandbox("sbx_fencedfencedfenced1")).toMatchObject({
      state: "running",
      node_lapsed: false,
    });
  });

  it("a node killed with SIGKILL shows its sandboxes stopped within one lease, and takes them back when it restarts", async () => {
    const { url, store } = await freshDatabase();
    const node = startMember(url, "node-b");
    await node.next("node");
    node.send({ op: "insert", id: "sbx_killedkilledkilled1" });
    expect(await node.next("insert")).toMatchObject({ ok: true });
    expect(await store.nodes.seenSandbox("sbx_killedkilledkilled1")).toMatchObject({ state: "running" });

    await node.kill("SIGKILL");
    const killedAt = await store.nodes.now();
    // Its last heartbeat came before the kill, so by the database's clock its lease ends within one lease of it.
    const row = (await store.nodes.nodes()).find((n) => n.id === "node-b");
    expect(row?.lease_expires_at).toBeLessThanOrEqual(killedAt + LEASE_MS);
    const seen = await until("node-b's sandbox to show stopped", async () => {
      const s = await store.nodes.seenSandbox("sbx_killedkilledkilled1");
      return s?.state === "stopped" ? s : undefined;
    });
    expect(seen).toMatchObject({ node_lapsed: true, node_id: "node-b", node_epoch: 1 });
    // The row itself is unchanged: it is readers who see it stopped; the node decides when it is back.
    expect(await store.getSandbox("sbx_killedkilledkilled1")).toMatchObject({ state: "running" });

    const restarted = startMember(url, "node-b");
    expect((await restarted.next("node")).epoch).toBe(2);
    expect(await store.nodes.seenSandbox("sbx_killedkilledkilled1")).toMatchObject({
      state: "running",
      node_lapsed: false,
      node_epoch: 2,
    });
    restarted.send({ op: "write", id: "sbx_killedkilledkilled1", value: "after-restart" });
    expect(await restarted.next("write")).toMatchObject({ ok: true });
  });
});

describe("the leader lease (PostgreSQL, real processes)", () => {
  it("one leader runs the jobs; a leader paused mid-job is refused when it wakes, and one killed is replaced within a lease", async () => {
    const { url, store } = await freshDatabase();
    const nodes = ["node-x", "node-y", "node-z"].map((id) => startMember(url, id));
    await Promise.all(nodes.map((m) => m.next("node")));
    const leaderOf = async (): Promise<{ member: Member; epoch: number }> => {
      const lease = await until("a leader", async () => {
        const l = await store.clusterLeases.lease("leader");
        return l && !l.lapsed ? l : undefined;
      });
      const member = nodes.find((m) => lease.holder.endsWith(`/${m.child.pid}`));
      if (!member) throw new Error(`the leader ${lease.holder} is none of the members`);
      return { member, epoch: lease.epoch };
    };
    const ticks = async (): Promise<Array<{ seq: number; epoch: number; held: boolean }>> =>
      (await store.eventsSince(0))
        .filter((e) => e.type === "cluster.tick")
        .map((e) => ({ seq: e.seq, ...(JSON.parse(e.data) as { epoch: number; held: boolean }) }));

    const first = await leaderOf();
    await first.member.next("job_done", (l) => l.epoch === first.epoch);
    // Only the leader runs the job.
    expect(nodes.filter((m) => m !== first.member).every((m) => !m.lines.some((l) => l.event === "job_done"))).toBe(
      true,
    );

    // Paused between its lease check and its write: the job's write comes after a successor took over.
    const from = first.member.lines.length;
    first.member.send({ op: "hold-next-job" });
    await first.member.next("job_waiting", undefined, from);
    await first.member.kill("SIGSTOP");
    const second = await until("another leader", async () => {
      const l = await leaderOf();
      return l.epoch > first.epoch ? l : undefined;
    });
    expect(second.member).not.toBe(first.member);
    await until("the new leader's job to run", async () => (await ticks()).find((t) => t.epoch === second.epoch));
    first.member.send({ op: "release" });
    first.member.child.kill("SIGCONT");
    expect(await first.member.next("job_refused", undefined, from)).toMatchObject({
      epoch: first.epoch,
      held: true,
      code: "lease_lost",
    });
    await first.member.next("leader_lost", undefined, from);
    const afterWake = await ticks();
    expect(afterWake.some((t) => t.held)).toBe(false);
    const firstOfSecond = Math.min(...afterWake.filter((t) => t.epoch === second.epoch).map((t) => t.seq));
    expect(afterWake.filter((t) => t.epoch === first.epoch && t.seq > firstOfSecond)).toEqual([]);

    // The second leader killed: one of the others leads within a lease and runs the job.
    await second.member.kill("SIGKILL");
    const third = await until("a third leader", async () => {
      const l = await leaderOf().catch(() => undefined);
      return l && l.epoch > second.epoch ? l : undefined;
    });
    expect(third.member).not.toBe(second.member);
    await until("the third leader's job to run", async () => (await ticks()).find((t) => t.epoch === third.epoch));
  });
});

describe("bothy serve with BOTHY_DATABASE_URL", () => {
  it("registers its node with what it offers and holds its lease; a clean stop hands the lease back", async () => {
    const { url, store } = await freshDatabase();
    const served = await startTestServer({
      BOTHY_DATABASE_URL: url,
      BOTHY_NODE_URL: "http://127.0.0.1:1",
      BOTHY_NODE_LEASE_S: "3",
    });
    let stopped = false;
    try {
      const id = (await readFile(join(served.home, "node-id"), "utf8")).trim();
      const [row, ...others] = await store.nodes.nodes();
      expect(others).toEqual([]);
      expect(row).toMatchObject({ id, url: "http://127.0.0.1:1", epoch: 1, lapsed: false });
      expect(JSON.parse(row?.drivers ?? "[]")).toContain("gvisor");
      expect(JSON.parse(row?.templates ?? "[]")).toContain("seed");
      // The leader's lease is this node's, the only one.
      const leader = await until("the leader's lease", async () => store.clusterLeases.lease("leader"));
      expect(leader.holder).toBe(`${id}/${process.pid}`);
      await served.stop();
      stopped = true;
      expect((await store.nodes.nodes())[0]).toMatchObject({ id, lapsed: true });
      expect(await store.clusterLeases.lease("leader")).toMatchObject({ lapsed: true });
    } finally {
      if (!stopped) await served.stop();
    }
  });
});
