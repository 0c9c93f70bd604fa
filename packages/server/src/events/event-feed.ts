import { EVENTS_CHANNEL, type EventRow } from "../ledger/event-rows.ts";
import type { LedgerStore } from "../ledger/store.ts";

/** Rows one read of the feed takes; it reads again at once while a read comes back full. */
const FEED_PAGE = 100;
/**
 * How often the feed reads even when nothing woke it: a bound on how late an event can be should a
 * notification be lost without the listening connection noticing.
 */
const POLL_MS = 5_000;

/**
 * Every event of a shared database, this node's and the other nodes', in `seq` order, each once: the
 * rows after the last one it delivered, read when an insert's notification (ledger/event-rows.ts)
 * or this node's own publish wakes it. Inserts commit in `seq` order, so reading `seq > last` never
 * passes a row that commits later. The notification only wakes it; what it delivers is what it read.
 */
export class EventFeed {
  /** The last row delivered; undefined until the feed has read where the table ends. */
  private cursor: number | undefined;
  private reading: Promise<void> | undefined;
  private again = false;
  private closed = false;
  private readonly unlisten: () => void;
  private readonly poll: NodeJS.Timeout;

  constructor(
    private readonly ledger: LedgerStore,
    private readonly deliver: (row: EventRow) => void,
    private readonly onError: (err: unknown) => void,
  ) {
    this.unlisten = ledger.listen(EVENTS_CHANNEL, () => this.wake());
    this.poll = setInterval(() => this.wake(), POLL_MS);
    this.poll.unref();
    this.wake();
  }

  /** Reads what was committed after the last row delivered (once more after a read under way ends). */
  wake(): void {
    if (this.closed) return;
    if (this.reading) {
      this.again = true;
      return;
    }
    this.reading = this.read().finally(() => {
      this.reading = undefined;
      if (this.again) {
        this.again = false;
        this.wake();
      }
    });
  }

  close(): void {
    this.closed = true;
    clearInterval(this.poll);
    this.unlisten();
  }

  private async read(): Promise<void> {
    try {
      // From the newest row when the feed starts: readers replay what came before from the ledger.
      this.cursor ??= await this.ledger.events.lastSeq();
      for (;;) {
        if (this.closed) return;
        const rows = await this.ledger.events.page(this.cursor, { tenant: null }, FEED_PAGE);
        for (const row of rows) {
          if (this.closed) return;
          this.cursor = row.seq;
          this.deliver(row);
        }
        if (rows.length < FEED_PAGE) return;
      }
    } catch (err) {
      // The next wake (a notification, a publish, the poll) reads from the same row again.
      this.onError(err);
    }
  }
}
