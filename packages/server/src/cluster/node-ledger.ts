import { LifecycleQueries } from "../ledger/lifecycle-rows.ts";
import type { SandboxRow } from "../ledger/sandbox-rows.ts";
import { SandboxQueries } from "../ledger/sandbox-rows.ts";
import type { LedgerStore } from "../ledger/store.ts";
import type { Fence } from "./fence.ts";

const sandboxes = new SandboxQueries();
const lifecycles = new LifecycleQueries();

/**
 * The ledger as a node's sandbox manager sees it on a shared database: the same store, with every
 * write the node makes for its sandboxes fenced by its lease's epoch (fence.ts: the row's insert,
 * each lifecycle move, its expiry and its sleep and timeout), the sandboxes it recovers, sweeps and
 * expires being its own, and sandboxes read as the API shows them (one of a node whose lease
 * lapsed shows `stopped`: its disk is on that node). A refused write throws `lease_lost` and
 * changes nothing. On one machine (SQLite) the manager gets the store itself: none of this runs.
 *
 * What is not fenced: command records and events (written many times per command; a record a
 * paused process writes late is about a command only it followed) and the rows of volumes,
 * secrets and snapshots (each checked against its sandbox's row when used).
 */
export function nodeLedger(store: LedgerStore, nodeId: string, fence: Fence): LedgerStore {
  return {
    ...store,
    insertSandbox: (row, idempotency) => fence.insertSandbox(row, idempotency),
    transition: (id, from, to, reason) => fence.write(id, () => sandboxes.transition(id, from, to, reason)),
    setExpiresAt: (id, expiresAt) => fence.write(id, () => sandboxes.setExpiresAt(id, expiresAt)),
    getSandbox: async (id) => seen(await store.nodes.seenSandbox(id)),
    listSandboxes: async (options = {}) =>
      options.includeDeleted ? store.listSandboxes(options) : (await store.nodes.seenSandboxes()).map(unseen),
    liveSandboxes: () => store.nodes.liveSandboxesOf(nodeId),
    expiredSandboxes: (at) => store.nodes.expiredSandboxesOf(nodeId, at),
    lifecycle: {
      ...store.lifecycle,
      put: (row) => fence.write(row.sandbox_id, () => lifecycles.put(row)),
      setTimeoutS: (id, timeoutS) => fence.write(id, () => lifecycles.setTimeoutS(id, timeoutS)),
      setAsleepBy: (id, cause) => fence.write(id, () => lifecycles.setAsleepBy(id, cause)),
    },
  };
}

/** A row as readers see it, without the reader's mark (the API shows `state` only). */
function unseen(row: SandboxRow & { node_lapsed: boolean }): SandboxRow {
  const { node_lapsed: _, ...rest } = row;
  return rest;
}

function seen(row: (SandboxRow & { node_lapsed: boolean }) | undefined): SandboxRow | undefined {
  return row && unseen(row);
}
