import type { BothyEvent } from "@bothy/protocol";
import type { Logger } from "./server-events.ts";

export interface WebhookOptions {
  url: string;
  /** First retry delay; each further retry doubles it. */
  retryBaseMs: number;
  attempts: number;
  timeoutMs: number;
  log: Logger;
}

/**
 * POSTs each event as JSON to one URL, in order, retrying failures with exponential backoff.
 * Delivery is at least once: a receiver should de-duplicate by `seq`.
 */
export class WebhookSender {
  private queue: Promise<void> = Promise.resolve();
  private stopped = false;
  private readonly inflight = new Set<AbortController>();

  constructor(private readonly opts: WebhookOptions) {}

  send(event: BothyEvent): void {
    this.queue = this.queue.then(() => this.deliver(event));
  }

  private async deliver(event: BothyEvent): Promise<void> {
    for (let attempt = 1; attempt <= this.opts.attempts && !this.stopped; attempt++) {
      const controller = new AbortController();
      this.inflight.add(controller);
      const timer = setTimeout(() => controller.abort(), this.opts.timeoutMs);
      try {
        const res = await fetch(this.opts.url, {
          method: "POST",
          headers: {
            "content-type": "application/json",
            "x-bothy-event": event.type,
            "x-bothy-delivery": String(event.seq),
          },
          body: JSON.stringify(event),
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
