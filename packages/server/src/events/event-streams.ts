import type { ServerResponse } from "node:http";

/** One open `GET /events` stream as the gauges read it. */
export interface OpenStream {
  res: ServerResponse;
  /**
   * `live`: events are written as they happen; `replaying`: it pages through the ledger to catch
   * up; `behind`: it waits for its client to read before it writes more.
   */
  state(): "live" | "replaying" | "behind";
}

export interface EventStreamGauges {
  live: number;
  replaying: number;
  behind: number;
  /** Bytes written to the streams that their clients have not taken yet. */
  bufferedBytes: number;
  /** LedgerStore rows the streams' replays have read, since start. */
  replayRows: number;
}

/**
 * The open event streams, read at scrape time, and what their replays read from the ledger: a
 * client that stops reading, or a replay from 0, must cost the server a bounded amount, and these
 * numbers (`bothy_event_stream*` on /metrics) are how an operator or a test sees that.
 */
export class EventStreams {
  private readonly open = new Set<OpenStream>();
  private rows = 0;

  track(stream: OpenStream): () => void {
    this.open.add(stream);
    return () => this.open.delete(stream);
  }

  /** A replay read `n` rows from the ledger. */
  read(n: number): void {
    this.rows += n;
  }

  gauges(): EventStreamGauges {
    const g: EventStreamGauges = { live: 0, replaying: 0, behind: 0, bufferedBytes: 0, replayRows: this.rows };
    for (const stream of this.open) {
      g[stream.state()]++;
      g.bufferedBytes += stream.res.writableLength;
    }
    return g;
  }
}
