import { randomBytes } from "node:crypto";
import { readFile, writeFile } from "node:fs/promises";
import { availableParallelism, totalmem } from "node:os";
import { join } from "node:path";
import type { Logger as PinoLogger } from "pino";
import type { ClusterConfig, Config } from "../config.ts";
import type { DriverRegistry } from "../drivers/driver-registry.ts";
import type { TemplateStore } from "../images/template-store.ts";
import type { NodeInfo } from "../ledger/node-rows.ts";
import type { LedgerStore } from "../ledger/store.ts";
import type { ClusterLog } from "./cluster-log.ts";
import { LeaderLease } from "./leader-lease.ts";
import { nodeLedger } from "./node-ledger.ts";
import { NodeLease } from "./node-lease.ts";

/** This server as a node of a cluster: its lease, the leader's lease it competes for, their store. */
export interface ClusterNode {
  readonly node: NodeLease;
  /** Register the cluster's periodic work here: only the leader runs it. */
  readonly leader: LeaderLease;
  readonly store: LedgerStore;
  /** The store as this node's sandbox manager uses it: its writes fenced, its sandboxes its own (node-ledger.ts). */
  readonly ledger: LedgerStore;
  /** Hands both leases back (the store stays open: it is the server's ledger). */
  stop(): Promise<void>;
}

/**
 * Joins the cluster on BOTHY_DATABASE_URL's PostgreSQL (the server's ledger, `store`): registers this node with what it offers,
 * takes its lease (waiting out a lease of its own id another process has not let lapse) and starts
 * competing for the leader's. The node's id is BOTHY_NODE_ID, or one made at the first start and
 * kept in the home, whose disks are the node's sandboxes: a restart is the same node and takes them
 * back.
 */
export async function startClusterNode(
  config: ClusterConfig,
  home: string,
  offer: Omit<NodeInfo, "id" | "url">,
  store: LedgerStore,
  logger: PinoLogger,
): Promise<ClusterNode> {
  if (store.dialect !== "postgres") throw new Error("A cluster node's ledger is the PostgreSQL at BOTHY_DATABASE_URL.");
  const id = await clusterNodeId(config, home);
  const log: ClusterLog = (level, event, fields) => logger[level]({ event, ...fields }, event);
  const node = new NodeLease({ store, info: { ...offer, id, url: config.nodeUrl }, leaseMs: config.leaseMs, log });
  const leader = new LeaderLease({ store, holder: `${id}/${process.pid}`, leaseMs: config.leaseMs, log });
  await node.start();
  leader.start();
  return {
    node,
    leader,
    store,
    ledger: nodeLedger(store, id, node.fence),
    async stop() {
      await leader.stop();
      await node.stop();
    },
  };
}

/** This node's id: BOTHY_NODE_ID, else the one kept in the home. */
export async function clusterNodeId(config: Pick<ClusterConfig, "nodeId">, home: string): Promise<string> {
  return config.nodeId ?? (await homeNodeId(home));
}

/** The id kept in `$BOTHY_HOME/node-id`, made (`node-` and 12 hex digits) at the first start. */
async function homeNodeId(home: string): Promise<string> {
  const file = join(home, "node-id");
  try {
    return (await readFile(file, "utf8")).trim();
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
  const made = `node-${randomBytes(6).toString("hex")}`;
  try {
    await writeFile(file, `${made}\n`, { flag: "wx", mode: 0o644 });
    return made;
  } catch (err) {
    // Another start made it first: its id is the node's.
    if ((err as NodeJS.ErrnoException).code === "EEXIST") return (await readFile(file, "utf8")).trim();
    throw err;
  }
}

/** What this node offers the cluster: its drivers, the templates it holds built, its host's CPUs and memory, its sandbox slots. */
export async function nodeOffer(
  config: Config,
  drivers: DriverRegistry,
  templates: Pick<TemplateStore, "list">,
): Promise<Omit<NodeInfo, "id" | "url">> {
  return {
    drivers: drivers.all().map((d) => d.name),
    templates: (await templates.list()).filter((t) => t.built !== undefined).map((t) => t.name),
    // The host's, which placement weighs sandboxes' shares against (cluster/placement.ts).
    vcpu: availableParallelism(),
    memoryMib: Math.floor(totalmem() / 2 ** 20),
    slots: config.limits.maxSandboxes,
  };
}
