import { createHmac } from "node:crypto";
import type { BothyEvent } from "@bothy/protocol";
import type { Logger } from "./server-events.ts";

export interface WebhookOptions {
  url: string;
  /** First retry delay; each further retry doubles it. */
  retryBaseMs: number;
  attempts: number;
  timeoutMs: number;
  /** Signs each delivery (see `signature`); undefined: unsigned. */
  secret?: string | undefined;
  /** Events waiting for delivery at most (default MAX_WAITING); past it new ones are dropped. */
  maxWaiting?: number;
  log: Logger;
}

/**
 * A receiver that is down or slow makes events wait (each up to its attempts and backoff); this
 * bounds how many the server holds for it. A dropped event is still in the ledger (until
 * BOTHY_EVENTS_RETENTION): a receiver catches up with `GET /events?since=SEQ`.
 */
export const MAX_WAITING = 10_000;

/** The header a receiver checks: `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>`. */
export const SIGNATURE_HEADER = "bothy-signature";

export function signature(secret: string, body: string, at: Date = new Date()): string {
  const t = Math.floor(at.getTime() / 1000);
  return `t=${t},v1=${createHmac("sha256", secret).update(`${t}.${body}`).digest("hex")}`;
}

/**
 * POSTs each event as JSON to one URL, in order, retrying failures with exponential backoff.
 * Delivery is at least once: a receiver should de-duplicate by `seq`.
 */
export class WebhookSender {
  private queue: Promise<void> = Promise.resolve();
  private waiting = 0;
  /** Events are being dropped (the backlog is full); logged once per such run. */
  private dropping = false;
  private stopped = false;
  private readonly inflight = new Set<AbortController>();

  constructor(private readonly opts: WebhookOptions) {}

  /** Events accepted and not yet delivered or given up. */
  get backlog(): number {
    return this.waiting;
  }

  send(event: BothyEvent): void {
    const max = this.opts.maxWaiting ?? MAX_WAITING;
    if (this.waiting >= max) {
      if (!this.dropping) this.opts.log("webhook_dropped", { seq: event.seq, waiting: this.waiting });
      this.dropping = true;
      return;
    }
    this.dropping = false;
    this.waiting++;
    this.queue = this.queue.then(async () => {
      try {
        await this.deliver(event);
      } finally {
        this.waiting--;
      }
    });
  }

  private async deliver(event: BothyEvent): Promise<void> {
    for (let attempt = 1; attempt <= this.opts.attempts && !this.stopped; attempt++) {
      const controller = new AbortController();
      this.inflight.add(controller);
      const timer = setTimeout(() => controller.abort(), this.opts.timeoutMs);
      try {
        const body = JSON.stringify(event);
        const res = await fetch(this.opts.url, {
          method: "POST",
          headers: {
            "content-type": "application/json",
            "x-bothy-event": event.type,
            "x-bothy-delivery": String(event.seq),
            // Signed per attempt, so a retry carries a fresh time a receiver's replay window accepts.
            ...(this.opts.secret === undefined ? {} : { [SIGNATURE_HEADER]: signature(this.opts.secret, body) }),
          },
          body,
          signal: controller.signal,
        });
        await res.body?.cancel();
        if (res.ok) return;
        this.opts.log("webhook_failed", { seq: event.seq, attempt, status: res.status });
      } catch (err) {
        this.opts.log("webhook_failed", { seq: event.seq, attempt, error: (err as Error).message });
      } finally {
        clearTimeout(timer);
        this.inflight.delete(controller);
      }
      if (attempt < this.opts.attempts) await this.sleep(this.opts.retryBaseMs * 2 ** (attempt - 1));
    }
    if (!this.stopped)
      this.opts.log("webhook_gave_up", { seq: event.seq, type: event.type, attempts: this.opts.attempts });
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => setTimeout(resolve, ms).unref());
  }

  /** Stops retrying; what is in flight is aborted. */
  close(): void {
    this.stopped = true;
    for (const c of this.inflight) c.abort();
  }
}
