import { BothyError } from "@bothy/protocol";
import { NodeQueries } from "../ledger/node-rows.ts";
import { SandboxQueries, type NewSandboxRow, type SandboxRow } from "../ledger/sandbox-rows.ts";
import type { Step } from "../ledger/sql-step.ts";
import type { LedgerStore } from "../ledger/store.ts";

const nodes = new NodeQueries();
const sandboxes = new SandboxQueries();

/**
 * The one way a node writes for its sandboxes on a shared database. Each write is one transaction
 * that first checks, by the database's clock, that this node's lease is still held with the epoch
 * this process holds it in, and that the sandbox is this node's in that epoch; PostgreSQL then keeps
 * the node's row share-locked until the write commits, so a successor's taking of the lease (an
 * update of that row) comes after the write, never between the check and it. A process that lost its
 * lease (paused past it, cut off from the database) finds out here, and its write changes nothing.
 */
export class Fence {
  constructor(
    private readonly store: LedgerStore,
    private readonly nodeId: string,
    /** The epoch this process holds the lease in; undefined while it holds none. */
    private readonly epoch: () => number | undefined,
  ) {}

  /** Runs `body` (the rows' steps) for sandbox `sandboxId` as one transaction, if this node owns it now. */
  async write<T>(sandboxId: string, body: () => Step<T>): Promise<T> {
    const { nodeId } = this;
    const epoch = this.held();
    return this.store.transaction(function* () {
      yield* checkLease(nodeId, epoch);
      const owner = yield* nodes.sandboxOwner(sandboxId);
      if (owner?.node_id !== nodeId || owner.node_epoch !== epoch)
        throw new BothyError(
          "lease_lost",
          `Sandbox ${sandboxId} is not this node's (${nodeId}, epoch ${epoch}) to change: it belongs to ${owner?.node_id ?? "no node"}${owner?.node_epoch == null ? "" : ` (epoch ${owner.node_epoch})`}. Send the request again: the node that owns it answers.`,
          { details: { sandbox_id: sandboxId, node_id: nodeId, epoch } },
        );
      return yield* body();
    });
  }

  /** Inserts a new sandbox's row as this node's, in the epoch it holds (with the create's idempotency key). */
  async insertSandbox(
    row: Omit<NewSandboxRow, "node_id" | "node_epoch">,
    idempotency?: { key: string; fingerprint: string },
  ): Promise<SandboxRow> {
    const { nodeId } = this;
    const epoch = this.held();
    return this.store.transaction(function* () {
      yield* checkLease(nodeId, epoch);
      return yield* sandboxes.insertSandbox({ ...row, node_id: nodeId, node_epoch: epoch }, idempotency);
    });
  }

  private held(): number {
    const epoch = this.epoch();
    if (epoch === undefined) throw lost(this.nodeId, undefined);
    return epoch;
  }
}

function* checkLease(nodeId: string, epoch: number): Step<void> {
  if (!(yield* nodes.holds(nodeId, epoch))) throw lost(nodeId, epoch);
}

function lost(nodeId: string, epoch: number | undefined): BothyError {
  return new BothyError(
    "lease_lost",
    `Node ${nodeId} no longer holds its lease${epoch === undefined ? "" : ` (epoch ${epoch})`}: it lapsed or passed to a successor, so nothing was written. Send the request again: the node's current holder answers.`,
    { details: { node_id: nodeId, ...(epoch === undefined ? {} : { epoch }) } },
  );
}
