/**
 * `GET /events` as an async iterable: sandbox and command events, replayed from `since` (an
 * event's `seq`) and then live until the signal aborts or the loop breaks.
 */
import { bothyEvent, type BothyEvent } from "@bothy/protocol";
import { SandboxError } from "./errors.ts";
import type { CallOptions, HttpClient } from "./http-client.ts";

export type { BothyEvent };

export interface EventOptions extends CallOptions {
  sandboxId?: string;
  /** Replay events after this sequence number (0: everything the ledger kept). */
  since?: number;
  /** Stop once the replayed events are read instead of waiting for live ones. */
  follow?: boolean;
  /** Called once the server has answered: from then on no new event is missed. */
  onOpen?: () => void;
}

type ReadResult = Awaited<ReturnType<ReadableStreamDefaultReader<string>["read"]>>;

/** How long a non-following stream waits for more replayed events before it ends. */
const REPLAY_QUIET_MS = 300;

export async function* streamEvents(http: HttpClient, options: EventOptions = {}): AsyncGenerator<BothyEvent> {
  const controller = new AbortController();
  const signal = options.signal ? AbortSignal.any([options.signal, controller.signal]) : controller.signal;
  const res = await http.fetch("GET", "/events", {
    query: { sandbox_id: options.sandboxId, since: options.since },
    headers: { accept: "text/event-stream" },
    timeout: false,
    signal,
  });
  options.onOpen?.();
  const reader = res.body?.pipeThrough(new TextDecoderStream()).getReader();
  if (!reader) return;
  let buffer = "";
  let quiet: NodeJS.Timeout | undefined;
  let pending: Promise<ReadResult> | undefined;
  try {
    for (;;) {
      pending ??= reader.read();
      let next: ReadResult;
      if (options.follow === false) {
        // SSE never ends by itself: a one-shot read stops when the replay has gone quiet.
        const timeout = new Promise<"quiet">((r) => (quiet = setTimeout(() => r("quiet"), REPLAY_QUIET_MS)));
        const raced = await Promise.race([pending, timeout]);
        clearTimeout(quiet);
        if (raced === "quiet") return;
        next = raced;
      } else {
        next = await pending;
      }
      pending = undefined;
      if (next.done) return;
      buffer += next.value;
      let end: number;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block
          .split("\n")
          .filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).trimStart())
          .join("\n");
        if (!data) continue;
        const parsed = bothyEvent.safeParse(JSON.parse(data));
        if (!parsed.success)
          throw new SandboxError("The server sent an event this SDK does not understand.", {
            code: "bad_response",
            cause: parsed.error,
          });
        yield parsed.data;
      }
    }
  } finally {
    clearTimeout(quiet);
    // The read still waiting (if any) fails when the request is aborted; nobody needs it.
    pending?.catch(() => undefined);
    controller.abort();
  }
}
