/**
 * Several `bothy serve` nodes of one cluster on this machine, as the cluster tests run them: one
 * PostgreSQL 15 of the test's own (helpers/postgres.ts), and per node its own home and loopback
 * port, the same admin key (test/auth-setup.ts), cluster secret file and `$BOTHY_HOME/secrets/` (the
 * first node's, copied to the others before their first start), gVisor, short leases. The
 * nodes share loopback, not a network namespace each: the forwarding between them is the same
 * HTTP either way, and a server inside a namespace needs its cgroup hierarchies mounted again
 * (traps.md).
 */
import { randomBytes } from "node:crypto";
import { cp, mkdtemp, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import pg from "pg";
import { freePort, startPostgres, type TestPostgres } from "./postgres.ts";
import { spawnTestServe, type ServeProcess } from "./serve-process.ts";

export interface ClusterNode {
  /** BOTHY_NODE_ID: `node-a`, `node-b`, … */
  readonly id: string;
  /** Its API and BOTHY_NODE_URL, e.g. http://127.0.0.1:41234 */
  readonly url: string;
  readonly home: string;
  /** The running process; replaced by `restart`. */
  serve: ServeProcess;
  /** Starts the node again on its home, port and id (after a `serve.kill()` or `serve.stop()`). */
  restart(): Promise<void>;
}

export interface ClusterNodes {
  readonly nodes: ClusterNode[];
  /** The cluster's database, as BOTHY_DATABASE_URL names it. */
  readonly databaseUrl: string;
  /** The file every node reads its cluster secret from (BOTHY_CLUSTER_SECRET_FILE). */
  readonly secretFile: string;
  /** Runs one query on the cluster's database (for tests that look at the rows themselves). */
  query<R extends pg.QueryResultRow>(sql: string, params?: unknown[]): Promise<R[]>;
  /** Every node's log lines that mention `text` (a sandbox id), one per line, each with its node: for a failure's message. */
  logsAbout(text: string): string;
  /** Stops every node, then PostgreSQL, and removes their directories. */
  stop(): Promise<void>;
}

export interface ClusterOptions {
  /** How many nodes (default 3). */
  count?: number;
  /** BOTHY_NODE_LEASE_S (default 3, the least allowed). */
  leaseS?: number;
  /** More environment for every node. */
  env?: Record<string, string>;
}

/** Starts PostgreSQL and `count` nodes at once; on any failure stops what it started. */
export async function startClusterNodes(options: ClusterOptions = {}): Promise<ClusterNodes> {
  const { count = 3, leaseS = 3, env = {} } = options;
  const postgres: TestPostgres = await startPostgres();
  const dir = await mkdtemp("/tmp/bothy-test-cluster-");
  const nodes: ClusterNode[] = [];
  const stop = async (): Promise<void> => {
    await Promise.all(nodes.map((n) => n.serve.stop()));
    await postgres.stop();
    await rm(dir, { recursive: true, force: true });
  };
  try {
    const databaseUrl = await postgres.createDatabase("bothy_cluster");
    const secretFile = join(dir, "cluster.secret");
    await writeFile(secretFile, `${randomBytes(32).toString("hex")}\n`, { mode: 0o600 });
    const names = Array.from({ length: count }, (_, i) => `node-${String.fromCharCode(97 + i)}`);
    const settings = { databaseUrl, secretFile, leaseS, env };
    // The first node makes the cluster's secrets (the pepper of its API keys, the vault key, the
    // token and CA keys) at its start; the others get a copy before theirs, as an operator copies them.
    const [first = "node-a", ...rest] = names;
    nodes.push(await startNode(first, join(dir, first), settings));
    for (const id of rest) await cp(join(dir, first, "secrets"), join(dir, id, "secrets"), { recursive: true });
    const started = await Promise.allSettled(rest.map((id) => startNode(id, join(dir, id), settings)));
    for (const s of started) if (s.status === "fulfilled") nodes.push(s.value);
    const failed = started.find((s): s is PromiseRejectedResult => s.status === "rejected");
    if (failed) throw failed.reason;
    return {
      nodes,
      databaseUrl,
      secretFile,
      async query(sql, params) {
        const client = new pg.Client({ connectionString: databaseUrl });
        await client.connect();
        try {
          return (await client.query(sql, params)).rows;
        } finally {
          await client.end();
        }
      },
      logsAbout: (text) =>
        nodes
          .flatMap((n) => n.serve.logs.map((l) => `${n.id} ${JSON.stringify(l)}`))
          .filter((line) => line.includes(text))
          .join("\n"),
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

async function startNode(
  id: string,
  home: string,
  cluster: { databaseUrl: string; secretFile: string; leaseS: number; env: Record<string, string> },
): Promise<ClusterNode> {
  // BOTHY_NODE_URL is known before the node listens, so its port is chosen here; one another
  // process took meanwhile makes the start fail, and it is tried again on another.
  for (let attempt = 0; ; attempt++) {
    const port = await freePort();
    const url = `http://127.0.0.1:${port}`;
    const spawnIt = (): ServeProcess =>
      spawnTestServe(home, {
        BOTHY_DRIVER: "gvisor",
        BOTHY_PORT: String(port),
        BOTHY_DATABASE_URL: cluster.databaseUrl,
        BOTHY_NODE_URL: url,
        BOTHY_NODE_ID: id,
        BOTHY_NODE_LEASE_S: String(cluster.leaseS),
        BOTHY_CLUSTER_SECRET_FILE: cluster.secretFile,
        ...cluster.env,
      });
    const serve = spawnIt();
    try {
      await serve.url;
    } catch (err) {
      await serve.kill();
      if (attempt >= 3) throw err;
      continue;
    }
    const node: ClusterNode = {
      id,
      url,
      home,
      serve,
      async restart() {
        node.serve = spawnIt();
        await node.serve.url;
      },
    };
    return node;
  }
}
