import pg from "pg";

/**
 * Called on a notification of its channel with the payload, or with `undefined` after the
 * listening connection was (re)made: notifications sent while it was down are lost, so a listener
 * then reads everything it cares about again.
 */
export type NotifyHandler = (payload: string | undefined) => void;

/** How long the listener waits before connecting again after its connection failed, doubling up to the most. */
const RETRY_MS = 250;
const MAX_RETRY_MS = 5_000;

/** A channel name as bothy's code spells them (they are written into LISTEN, which takes no parameter). */
const CHANNEL_RE = /^bothy_[a-z_]{1,40}$/;

/**
 * One connection of the process's own, outside the pool, that LISTENs on the channels its handlers
 * name (PostgreSQL delivers a notification only to the session that listens). It connects on the
 * first `listen`, and after a failure connects again with backoff, telling every handler
 * (`undefined`) once it is back. Notifications are wake-ups: handlers read the rows.
 */
export class PgListener {
  private readonly handlers = new Map<string, Set<NotifyHandler>>();
  private client: pg.Client | undefined;
  private connecting: Promise<void> | undefined;
  private retryMs = RETRY_MS;
  private retry: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(private readonly url: string) {}

  /** Calls `handler` on each notification of `channel`; answers the function that stops it. */
  listen(channel: string, handler: NotifyHandler): () => void {
    if (!CHANNEL_RE.test(channel)) throw new Error(`not a bothy channel name: ${channel}`);
    let set = this.handlers.get(channel);
    if (!set) {
      this.handlers.set(channel, (set = new Set()));
      if (this.client) void this.client.query(`LISTEN ${channel}`).catch(() => this.lost());
    }
    set.add(handler);
    this.connect();
    return () => {
      set.delete(handler);
    };
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.retry);
    await this.connecting?.catch(() => undefined);
    const client = this.client;
    this.client = undefined;
    await client?.end().catch(() => undefined);
  }

  private connect(): void {
    if (this.closed || this.client || this.connecting) return;
    this.connecting = (async () => {
      const client = new pg.Client({ connectionString: this.url });
      // An error on an idle listening connection (the server restarted) ends it; `end` follows.
      client.on("error", () => undefined);
      client.on("end", () => {
        if (this.client === client) this.lost();
      });
      client.on("notification", (msg) => this.deliver(msg.channel, msg.payload));
      try {
        await client.connect();
        for (const channel of this.handlers.keys()) await client.query(`LISTEN ${channel}`);
      } catch {
        await client.end().catch(() => undefined);
        this.connecting = undefined;
        return this.later();
      }
      this.connecting = undefined;
      if (this.closed) return void (await client.end().catch(() => undefined));
      this.client = client;
      this.retryMs = RETRY_MS;
      // Whatever was sent while no connection listened is lost: every handler reads again.
      for (const channel of this.handlers.keys()) this.deliver(channel, undefined);
    })();
  }

  private lost(): void {
    const client = this.client;
    this.client = undefined;
    void client?.end().catch(() => undefined);
    this.later();
  }

  private later(): void {
    if (this.closed || this.retry) return;
    this.retry = setTimeout(() => {
      this.retry = undefined;
      this.connect();
    }, this.retryMs);
    this.retry.unref();
    this.retryMs = Math.min(this.retryMs * 2, MAX_RETRY_MS);
  }

  private deliver(channel: string, payload: string | undefined): void {
    for (const handler of [...(this.handlers.get(channel) ?? [])]) {
      try {
        handler(payload);
      } catch {
        // A handler's own failure is its own; the others still hear.
      }
    }
  }
}
