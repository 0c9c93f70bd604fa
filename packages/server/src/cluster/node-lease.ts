import { EventEmitter } from "node:events";
import { performance } from "node:perf_hooks";
import type { NodeInfo } from "../ledger/node-rows.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { messageOf, quiet, type ClusterLog } from "./cluster-log.ts";
import { Fence } from "./fence.ts";

export interface NodeLeaseOptions {
  store: LedgerStore;
  info: NodeInfo;
  /** How long a lease lasts past each heartbeat (the database's clock); heartbeats come three times per lease. */
  leaseMs: number;
  /** What the node holds now, sent with each heartbeat; default: what `info` said at start. */
  status?: () => Pick<NodeInfo, "templates" | "slots">;
  log?: ClusterLog;
}

/**
 * This node's row in a shared database and its lease (ledger/node-rows.ts): `start` registers the
 * node and takes the lease, waiting out a predecessor's that has not lapsed (a process of this node
 * that was killed, or is paused: it may still be alive, and only the lease's end makes it harmless),
 * then names the node's sandboxes as the new epoch's. Heartbeats renew it; a heartbeat that finds it
 * lapsed or taken (`lost`) stops this process's writes (`fence` refuses them from then on) and the
 * next heartbeats try to take it again, in a new epoch.
 *
 * This host's clock keeps a second, earlier deadline: a lease counts as held only until one lease
 * after its last renewal was sent (the monotonic clock, which runs on while the process is stopped).
 * The database's expiry is never earlier than that, so a process that wakes from a pause past its
 * lease knows it lost it before its first query, and refuses writes (`fence`) and host work
 * (`surelyHeld`) at once, before a successor's work can be raced.
 */
export class NodeLease extends EventEmitter<{ acquired: [epoch: number]; lost: [epoch: number] }> {
  private held: number | undefined;
  /** performance.now() until which the lease surely holds: one lease after the last renewal was sent. */
  private validUntil = 0;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private beat: Promise<void> | undefined;
  /** Every write for this node's sandboxes goes through it. */
  readonly fence: Fence;

  constructor(private readonly options: NodeLeaseOptions) {
    super();
    this.fence = new Fence(options.store, options.info.id, () => (this.surelyHeld() ? this.held : undefined));
  }

  get id(): string {
    return this.options.info.id;
  }

  /** The epoch this process holds the node's lease in; undefined while it holds none. */
  get epoch(): number | undefined {
    return this.held;
  }

  /** Whether this process holds the lease by its own clock now (no database round trip): host work asks this. */
  surelyHeld(): boolean {
    return this.held !== undefined && performance.now() < this.validUntil;
  }

  private get log(): ClusterLog {
    return this.options.log ?? quiet;
  }

  private get beatMs(): number {
    return Math.max(50, Math.floor(this.options.leaseMs / 3));
  }

  /**
   * Takes the lease (waiting, a heartbeat at a time, while another holding of it has not lapsed) and
   * starts heartbeats; resolves with the epoch. Rejects if stopped first.
   */
  async start(): Promise<number> {
    let waited = false;
    for (;;) {
      if (this.stopped) throw new Error("the node's lease was stopped before it was taken");
      const epoch = await this.tryAcquire().catch((err: unknown) => {
        this.log("warn", "node_lease_failed", { node: this.id, error: messageOf(err) });
        return undefined;
      });
      if (epoch !== undefined) {
        this.schedule();
        return epoch;
      }
      if (!waited)
        this.log("info", "node_lease_waiting", {
          node: this.id,
          why: "another holding of this node's lease has not lapsed yet (a killed or paused process of this node)",
        });
      waited = true;
      await new Promise((resolve) => setTimeout(resolve, this.beatMs));
    }
  }

  /** Ends the lease now, so the node's next start takes it at once; heartbeats stop. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.beat;
    const epoch = this.held;
    this.held = undefined;
    if (epoch !== undefined) await this.options.store.nodes.release(this.id, epoch).catch(() => false);
  }

  private async tryAcquire(): Promise<number | undefined> {
    const { store, info, leaseMs } = this.options;
    const sent = performance.now();
    const got = await store.nodes.acquire(info, leaseMs);
    if (!got) return undefined;
    this.validUntil = sent + leaseMs;
    // Taken over in the same epoch's name before anything else of this process writes for them.
    const claimed = await store.nodes.claimSandboxes(info.id, got.epoch);
    this.held = got.epoch;
    this.log("info", "node_lease_acquired", { node: info.id, epoch: got.epoch, sandboxes: claimed });
    this.emit("acquired", got.epoch);
    return got.epoch;
  }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.beat = this.heartbeat().finally(() => {
        this.beat = undefined;
        this.schedule();
      });
    }, this.beatMs);
    this.timer.unref();
  }

  private async heartbeat(): Promise<void> {
    const { store, info, leaseMs, status } = this.options;
    try {
      if (this.held === undefined) {
        await this.tryAcquire();
        return;
      }
      const epoch = this.held;
      if (!this.surelyHeld())
        return this.lose(
          epoch,
          "no renewal reached the database within a lease by this host's clock (this process was paused or cut off from the database)",
        );
      const sent = performance.now();
      const renewed = await store.nodes.heartbeat(info.id, epoch, leaseMs, status?.() ?? info);
      if (renewed !== undefined && this.held === epoch) this.validUntil = sent + leaseMs;
      else if (renewed === undefined && this.held === epoch)
        this.lose(
          epoch,
          "it lapsed (this process was paused or cut off from the database past the lease) or a successor took it",
        );
    } catch (err) {
      // The database did not answer: the lease may still hold; the next heartbeat tries again, and
      // writes meanwhile are checked against the database by the fence.
      this.log("warn", "node_lease_failed", { node: info.id, error: messageOf(err) });
    }
  }

  private lose(epoch: number, why: string): void {
    this.held = undefined;
    this.log("error", "node_lease_lost", {
      node: this.id,
      epoch,
      why: `${why}; writes are refused until it is taken again`,
    });
    this.emit("lost", epoch);
  }
}
