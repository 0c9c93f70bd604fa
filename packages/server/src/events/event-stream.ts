import type { ServerResponse } from "node:http";
import { setImmediate as nextTurn } from "node:timers/promises";
import type { BothyEvent } from "@bothy/protocol";
import type { EventScope } from "../ledger/event-rows.ts";
import type { EventBus } from "./event-bus.ts";
import type { EventStreams } from "./event-streams.ts";

/** Rows one ledger query reads; also the most the stream holds that its socket has not taken. */
export const PAGE_ROWS = 100;
const KEEPALIVE_MS = 15_000;

/**
 * One `GET /events` stream. The ledger is its queue: it writes events as they happen while its
 * client keeps up, and when the socket's buffer is full (or it starts from a Last-Event-ID) it
 * stops writing and later pages through the ledger from the last event it wrote, one query of at
 * most PAGE_ROWS of the reader's own rows at a time, yielding between pages. So a client that
 * stops reading costs the server one socket buffer and one page, however many events follow,
 * and still gets every event, in order, once it reads again.
 */
export class EventStream {
  private state: "live" | "replaying" | "behind" = "replaying";
  /** The last event written, or passed over in live mode (the next page starts after it). */
  private cursor = 0;
  /** The rest of a page read but not yet written (the socket was full). */
  private pending: BothyEvent[] = [];
  /**
   * Events published while a page was read (the read is asynchronous: one may land after the
   * page's query and before the stream is live again), at most PAGE_ROWS; `overflowed` when more came.
   */
  private arrived: Array<{ event: BothyEvent; tenant: string | null }> = [];
  private overflowed = false;
  private closed = false;
  private readonly unsubscribe: () => void;
  private readonly untrack: () => void;
  private readonly keepalive: NodeJS.Timeout;

  constructor(
    private readonly res: ServerResponse,
    private readonly bus: EventBus,
    private readonly scope: EventScope,
    private readonly streams: EventStreams,
    from: number | undefined,
  ) {
    // Subscribed before the ledger is read: what is published meanwhile is kept (`arrived`).
    this.unsubscribe = bus.follow((event, tenant) => this.onEvent(event, tenant));
    this.untrack = streams.track({ res, state: () => this.state });
    this.keepalive = setInterval(() => {
      if (this.state === "live" && !res.write(": keepalive\n\n")) this.waitForClient();
    }, KEEPALIVE_MS);
    void this.begin(from);
  }

  /** From the newest event when no Last-Event-ID came, else from it: a first page, then live. */
  private async begin(from: number | undefined): Promise<void> {
    try {
      this.cursor = from ?? (await this.bus.lastSeq());
    } catch {
      return void this.res.destroy();
    }
    await this.catchUp();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.pending = [];
    clearInterval(this.keepalive);
    this.unsubscribe();
    this.untrack();
  }

  private onEvent(event: BothyEvent, tenant: string | null): void {
    if (this.state === "replaying") {
      if (this.arrived.length < PAGE_ROWS) this.arrived.push({ event, tenant });
      else this.overflowed = true;
      return;
    }
    if (this.state !== "live") return; // the next page reads it from the ledger
    // Read by a page already (a feed of other nodes' events may run behind this stream's pages).
    if (event.seq <= this.cursor) return;
    this.cursor = event.seq;
    if (!this.inScope(event, tenant)) return;
    if (!this.write(event)) this.waitForClient();
  }

  private inScope(event: BothyEvent, tenant: string | null): boolean {
    if (this.scope.sandboxId !== undefined && event.sandbox_id !== this.scope.sandboxId) return false;
    return this.scope.tenant === null || tenant === this.scope.tenant;
  }

  /** Writes one event; false when the socket's buffer is full (the client is not reading). */
  private write(event: BothyEvent): boolean {
    return this.res.write(`id: ${event.seq}\nevent: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`);
  }

  private waitForClient(): void {
    if (this.closed) return;
    this.state = "behind";
    this.res.once("drain", () => void this.catchUp());
  }

  /**
   * Pages from the cursor until a page comes back short and every row of it went out, then the
   * events published while that page was read and after its rows (the page's query may have run
   * before they landed), and the stream is live from that moment, so nothing is missed. An event
   * published before a page's read began is in the ledger by then (a publish reaches subscribers
   * only once its row is written), so the page has it.
   */
  private async catchUp(): Promise<void> {
    this.state = "replaying";
    for (;;) {
      if (this.closed) return;
      if (!this.flush()) return this.waitForClient();
      this.arrived = [];
      this.overflowed = false;
      let rows: BothyEvent[];
      try {
        rows = await this.bus.page(this.cursor, this.scope, PAGE_ROWS);
      } catch {
        // The ledger did not answer: the client reconnects with its Last-Event-ID.
        return void this.res.destroy();
      }
      if (this.closed) return;
      this.streams.read(rows.length);
      this.pending = rows;
      if (!this.flush()) return this.waitForClient();
      if (rows.length < PAGE_ROWS && !this.overflowed) {
        const after = this.cursor;
        const late = this.arrived.filter((a) => a.event.seq > after);
        this.arrived = [];
        this.state = "live";
        // Written as live events are: the cursor passes over those of other scopes.
        for (const { event, tenant } of late) {
          if (this.state !== "live") break; // the socket filled: the next page reads the rest
          this.onEvent(event, tenant);
        }
        return;
      }
      await nextTurn(); // other requests run between pages
    }
  }

  /** Writes what is pending until the socket is full; true when all went. */
  private flush(): boolean {
    let i = 0;
    while (i < this.pending.length) {
      const event = this.pending[i++] as BothyEvent;
      this.cursor = event.seq;
      if (!this.write(event)) {
        this.pending = this.pending.slice(i);
        return false;
      }
    }
    this.pending = [];
    return true;
  }
}
