/**
 * Approvals: a request or tool call an `ask` rule holds until a person decides. The ledger's row
 * is the truth. A decision moves it out of `pending` by a compare-and-set that is durable before
 * the held caller is released, so an approved request goes out exactly once and a second decision
 * finds nothing to decide. Nothing held outlives the process: a stop cancels every waiter, and a
 * start cancels every row a previous process of its node left pending.
 *
 * On a database several nodes share, a request held on one node may be decided through another:
 * the decision's compare-and-set notifies, and the node holding the caller reads the row and
 * answers it (and reads its callers' rows every POLL_MS, should a notification be lost). The row
 * is the outcome; the notification only says which row to read.
 */
import {
  BothyError,
  decideApprovalRequest,
  type ApprovalCancelReason,
  type ApprovalInfo,
  type ApprovalState,
} from "@bothy/protocol";
import type { z } from "zod";
import type { Logger } from "../events/server-events.ts";
import {
  APPROVALS_CHANNEL,
  toApprovalInfo,
  type ApprovalRow,
  type ApprovalRows,
  type Settlement,
} from "../ledger/approval-rows.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { newApprovalId } from "../util/ids.ts";
import type { ApprovalAsk, ApprovalGate, ApprovalOutcome } from "./contracts.ts";

/** The most of a body or of a tool's arguments an approval shows. */
export const EXCERPT_BYTES = 8 * 1024;

/** How often a node of a cluster reads its held callers' rows, whatever notifications it heard. */
const POLL_MS = 2_000;

export type ApprovalDecision = z.output<typeof decideApprovalRequest>;

export interface ApprovalBrokerOptions {
  rows: ApprovalRows;
  /** How long an approval waits for a person before it expires. */
  timeoutMs: number;
  /** Emits `approval_requested` and `approval_decided` (which become the public events). */
  log: Logger;
  /**
   * On a database several nodes share: this node's id (its rows are the ones its start cancels)
   * and the store's notifications, by which it hears of decisions made through other nodes.
   */
  cluster?: { nodeId: string; listen: LedgerStore["listen"] };
}

interface Waiter {
  finish(outcome: ApprovalOutcome): void;
}

/** `text` cut to at most `EXCERPT_BYTES` of UTF-8, never inside a character. */
export function excerptOf(text: string): string {
  const bytes = Buffer.from(text, "utf8");
  if (bytes.length <= EXCERPT_BYTES) return text;
  let end = EXCERPT_BYTES;
  // Back off continuation bytes (10xxxxxx) so the cut falls between characters.
  while (end > 0 && ((bytes[end] ?? 0) & 0xc0) === 0x80) end--;
  return bytes.subarray(0, end).toString("utf8");
}

export const approvalNotFound = (id: string): BothyError =>
  new BothyError("approval_not_found", `No approval ${id.slice(0, 64)}; GET /approvals?state=pending lists them.`);

export class ApprovalBroker implements ApprovalGate {
  private readonly waiters = new Map<string, Waiter>();
  private stopped = false;
  private readonly unlisten: () => void = () => undefined;
  private readonly poll: NodeJS.Timeout | undefined;

  constructor(private readonly opts: ApprovalBrokerOptions) {
    if (opts.cluster) {
      this.unlisten = opts.cluster.listen(APPROVALS_CHANNEL, (id) => this.recheck(id || undefined));
      this.poll = setInterval(() => this.recheck(undefined), POLL_MS);
      this.poll.unref();
    }
  }

  /**
   * At start-up, before anything asks: every approval a previous process left pending is
   * cancelled (`server_restarted`). Its held request died with that process and never went out,
   * and a late approval must not send anything. Returns how many there were.
   */
  async recover(): Promise<number> {
    const rows = await this.opts.rows.cancelAllPending(
      "server_restarted",
      undefined,
      this.opts.cluster?.nodeId ?? null,
    );
    for (const row of rows) this.opts.log("approval_decided", toApprovalInfo(row));
    return rows.length;
  }

  granted(sandboxId: string, host: string): Promise<boolean> {
    return this.opts.rows.hostGranted(sandboxId, host.toLowerCase().replace(/\.$/, ""), new Date().toISOString());
  }

  /** `onRequested`: told the new approval's id once it is pending (to offer the question elsewhere too). */
  async ask(
    req: ApprovalAsk,
    signal: AbortSignal,
    onRequested?: (approvalId: string) => void,
  ): Promise<ApprovalOutcome> {
    const id = newApprovalId();
    const created = Date.now();
    await this.opts.rows.insert({
      id,
      tenant: req.tenant,
      sandbox_id: req.sandboxId,
      conversation_id: req.conversationId,
      kind: req.kind,
      method: req.method,
      host: req.host === null ? null : req.host.toLowerCase().replace(/\.$/, ""),
      path: req.path,
      tool: req.tool,
      excerpt: excerptOf(req.excerpt),
      rule: req.rule,
      created_at: new Date(created).toISOString(),
      expires_at: new Date(created + this.opts.timeoutMs).toISOString(),
      node_id: this.opts.cluster?.nodeId ?? null,
    });
    const row = await this.opts.rows.get(id);
    if (row) this.opts.log("approval_requested", toApprovalInfo(row));
    return new Promise<ApprovalOutcome>((resolve) => {
      const onAbort = (): void => void this.cancel(id, "client_gone");
      const timer = setTimeout(() => void this.expire(id).catch(() => undefined), this.opts.timeoutMs);
      timer.unref();
      this.waiters.set(id, {
        finish: (outcome) => {
          clearTimeout(timer);
          signal.removeEventListener("abort", onAbort);
          this.waiters.delete(id);
          resolve(outcome);
        },
      });
      signal.addEventListener("abort", onAbort, { once: true });
      if (this.stopped) void this.cancel(id, "server_stopping");
      else if (signal.aborted) onAbort();
      else onRequested?.(id);
    });
  }

  /** An approval as stored, or undefined. */
  async get(id: string): Promise<ApprovalInfo | undefined> {
    const row = await this.opts.rows.get(id);
    if (row && row.state === "pending" && Date.parse(row.expires_at) <= Date.now())
      return (await this.expire(id)) ?? (await this.info(id));
    return row && toApprovalInfo(row);
  }

  async list(filter: {
    tenant?: string;
    state?: ApprovalState;
    sandboxId?: string;
    limit: number;
  }): Promise<ApprovalInfo[]> {
    return (await this.opts.rows.list(filter)).map(toApprovalInfo);
  }

  /**
   * Approves a pending approval: durable in the ledger before the held caller goes on. A `host`
   * grant lets the sandbox's later requests to the same host through for `minutes` as well.
   */
  async approve(id: string, decision: ApprovalDecision, decidedBy: string | null): Promise<ApprovalInfo> {
    const row = await this.pendingRow(id);
    if (decision.grant === "host") {
      if (row.kind !== "http" || row.host === null)
        throw new BothyError(
          "invalid_request",
          `Approval ${id} is for the tool ${row.tool ?? "?"}, which has no host: approve it with grant "once".`,
        );
      if (decision.minutes === undefined)
        throw new BothyError("invalid_request", 'A "host" grant needs minutes (1 to 1440): how long it lasts.');
    } else if (decision.minutes !== undefined)
      throw new BothyError("invalid_request", 'minutes applies to a "host" grant only; leave it out for "once".');
    const grantUntil =
      decision.grant === "host" && decision.minutes !== undefined
        ? new Date(Date.now() + decision.minutes * 60_000).toISOString()
        : null;
    return this.decided(id, {
      state: "approved",
      decidedBy,
      grantKind: decision.grant,
      grantUntil,
      reason: decision.reason ?? null,
    });
  }

  async deny(id: string, reason: string | undefined, decidedBy: string | null): Promise<ApprovalInfo> {
    await this.pendingRow(id);
    return this.decided(id, { state: "denied", decidedBy, grantKind: null, grantUntil: null, reason: reason ?? null });
  }

  /** Graceful stop: every held caller is answered `cancelled` (server_stopping) and every timer cleared. */
  stop(): void {
    this.stopped = true;
    clearInterval(this.poll);
    this.unlisten();
    // Each waiter is answered once its row is settled; a row that cannot be written is still answered.
    for (const [id, waiter] of [...this.waiters])
      void this.cancel(id, "server_stopping").catch(() =>
        waiter.finish({ approvalId: id, state: "cancelled", cancelReason: "server_stopping" }),
      );
  }

  /** How many callers are held now (for tests and metrics). */
  get held(): number {
    return this.waiters.size;
  }

  private async info(id: string): Promise<ApprovalInfo | undefined> {
    const row = await this.opts.rows.get(id);
    return row && toApprovalInfo(row);
  }

  /** The row, if it can still be decided; an expired one is marked so first. */
  private async pendingRow(id: string): Promise<ApprovalRow> {
    const row = await this.opts.rows.get(id);
    if (!row) throw approvalNotFound(id);
    if (row.state === "pending" && Date.parse(row.expires_at) <= Date.now()) await this.expire(id);
    const now = (await this.opts.rows.get(id)) ?? row;
    if (now.state !== "pending") throw notPending(now);
    return now;
  }

  private async decided(id: string, how: Settlement): Promise<ApprovalInfo> {
    const row = await this.settle(id, how);
    if (!row) {
      const now = await this.opts.rows.get(id);
      throw now ? notPending(now) : approvalNotFound(id);
    }
    return toApprovalInfo(row);
  }

  private async expire(id: string): Promise<ApprovalInfo | undefined> {
    const row = await this.settle(id, {
      state: "expired",
      decidedBy: null,
      grantKind: null,
      grantUntil: null,
      reason: null,
    });
    return row && toApprovalInfo(row);
  }

  private async cancel(id: string, reason: ApprovalCancelReason): Promise<void> {
    await this.settle(id, { state: "cancelled", decidedBy: null, grantKind: null, grantUntil: null, reason });
  }

  /**
   * Moves a pending row on (the ledger's compare-and-set), then releases its waiter, if any. When
   * the row was decided already (through another node, which won the compare-and-set), its waiter
   * here is answered with that decision.
   */
  private async settle(id: string, how: Settlement): Promise<ApprovalRow | undefined> {
    const row = await this.opts.rows.settle(id, how);
    if (!row) {
      // Unreadable now: the next notification or poll answers it.
      if (this.waiters.has(id)) await this.learn(id).catch(() => undefined);
      return undefined;
    }
    this.opts.log("approval_decided", toApprovalInfo(row));
    this.waiters.get(id)?.finish(outcomeOf(row));
    return row;
  }

  /** Reads the rows of held callers (`id`'s, or all of them) and answers those decided elsewhere. */
  private recheck(id: string | undefined): void {
    const ids = id === undefined ? [...this.waiters.keys()] : this.waiters.has(id) ? [id] : [];
    for (const held of ids)
      void this.learn(held).catch((err: unknown) =>
        this.opts.log("ledger_read_failed", { what: `approval ${held}`, error: (err as Error).message }),
      );
  }

  /** Answers the held caller of `id` with its row's decision, once there is one. */
  private async learn(id: string): Promise<void> {
    const row = await this.opts.rows.get(id);
    if (row && row.state !== "pending") this.waiters.get(id)?.finish(outcomeOf(row));
  }
}

/** What a held caller is told of its decided row. */
function outcomeOf(row: ApprovalRow): ApprovalOutcome {
  const outcome: ApprovalOutcome = { approvalId: row.id, state: row.state as ApprovalOutcome["state"] };
  if (row.state === "cancelled") outcome.cancelReason = row.reason as ApprovalCancelReason;
  else if (row.reason !== null) outcome.reason = row.reason;
  return outcome;
}

function notPending(row: ApprovalRow): BothyError {
  return new BothyError(
    "approval_not_pending",
    `Approval ${row.id} is ${row.state} already${row.decided_at ? ` (since ${row.decided_at})` : ""}; only a pending approval can be decided.`,
    { details: { state: row.state } },
  );
}
