import type { BothyEvent } from "@bothy/protocol";
import type { EventScope } from "../ledger/event-rows.ts";
import type { EventRow } from "../ledger/ledger.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { EventFeed } from "./event-feed.ts";

/** `tenant`: the event's tenant, or null for a host-wide one (shown to admin keys only). */
export type EventListener = (event: BothyEvent, tenant: string | null) => void;

/**
 * Lifecycle and command events: written to the ledger first (so a client that reconnects with
 * its last event id misses nothing), then handed to live subscribers and the webhook.
 *
 * Two kinds of listener: `subscribe` hears this process's own publishes (the webhook, which each
 * node sends for its own events); `follow` hears every event of the ledger in `seq` order, each
 * once (the `/events` streams). On SQLite the two are the same events. On a shared database
 * (PostgreSQL, several nodes) followers are fed by an `EventFeed`, which reads the rows every node
 * commits, in order, when an insert's notification or an own publish wakes it.
 */
export class EventBus {
  private readonly listeners = new Set<EventListener>();
  private readonly followers = new Set<EventListener>();
  /** The publishes under way, one after another: subscribers get events in the order of their numbers. */
  private chain: Promise<unknown> = Promise.resolve();
  /** Only on a shared database: every node's events, read back from the ledger. */
  private readonly feed: EventFeed | undefined;

  constructor(
    private readonly ledger: LedgerStore,
    onFeedError: (err: unknown) => void = () => undefined,
  ) {
    if (ledger.dialect === "postgres")
      this.feed = new EventFeed(ledger, (row) => this.tell(this.followers, toEvent(row), row.tenant), onFeedError);
  }

  publish(
    type: BothyEvent["type"],
    sandboxId: string | null,
    data: Record<string, unknown>,
    tenant?: string,
  ): Promise<BothyEvent> {
    const done = this.chain.then(async () => {
      const row = await this.ledger.insertEvent(type, sandboxId, data, tenant);
      const event = toEvent(row);
      this.tell(this.listeners, event, row.tenant);
      if (this.feed) this.feed.wake();
      else this.tell(this.followers, event, row.tenant);
      return event;
    });
    this.chain = done.catch(() => undefined);
    return done;
  }

  /** Hears the events this process publishes, as they are written. */
  subscribe(listener: EventListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Hears every event of the ledger, whichever node wrote it, in `seq` order and once each. */
  follow(listener: EventListener): () => void {
    this.followers.add(listener);
    return () => this.followers.delete(listener);
  }

  close(): void {
    this.feed?.close();
  }

  private tell(listeners: Set<EventListener>, event: BothyEvent, tenant: string | null): void {
    for (const listener of [...listeners]) listener(event, tenant);
  }

  async since(seq: number, sandboxId?: string): Promise<BothyEvent[]> {
    return (await this.ledger.eventsSince(seq, sandboxId)).map(toEvent);
  }

  /** A sandbox's events of these types after `seq` (its audit). */
  async ofSandbox(sandboxId: string, types: readonly string[], seq: number, limit: number): Promise<BothyEvent[]> {
    return (await this.ledger.sandboxEvents(sandboxId, types, seq, limit)).map(toEvent);
  }

  /**
   * The scope's events after `seq`, oldest first, at most `limit`, read from the scope's own rows.
   * A tenant's scope on a sandbox of another tenant (or none) has no rows and reads none.
   */
  async page(seq: number, scope: EventScope, limit: number): Promise<BothyEvent[]> {
    if (scope.tenant !== null && scope.sandboxId !== undefined)
      if ((await this.ledger.getSandbox(scope.sandboxId))?.tenant !== scope.tenant) return [];
    return (await this.ledger.events.page(seq, scope, limit)).map(toEvent);
  }

  /** The newest event's sequence number (0 for none). */
  lastSeq(): Promise<number> {
    return this.ledger.events.lastSeq();
  }
}

function toEvent(row: EventRow): BothyEvent {
  return {
    seq: row.seq,
    type: row.type as BothyEvent["type"],
    sandbox_id: row.sandbox_id,
    data: JSON.parse(row.data) as Record<string, unknown>,
    created_at: row.created_at,
  };
}
