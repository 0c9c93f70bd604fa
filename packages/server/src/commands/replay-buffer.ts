import type { CommandEvent } from "@bothy/protocol";

type OutputEvent = Extract<CommandEvent, { type: "stdout" | "stderr" }>;

/**
 * The most recent output of one command, bounded in bytes, for clients that attach late. When
 * older output has to go, the count of dropped bytes is kept so a re-attaching client is told.
 */
export class ReplayBuffer {
  private events: OutputEvent[] = [];
  private bytes = 0;
  private droppedBytes = 0;

  constructor(private readonly maxBytes: number) {}

  push(event: OutputEvent): void {
    this.events.push(event);
    this.bytes += event.data.length;
    while (this.bytes > this.maxBytes && this.events.length > 1) {
      const old = this.events.shift();
      if (!old) break;
      this.bytes -= old.data.length;
      this.droppedBytes += rawBytes(old);
    }
    const only = this.events[0];
    if (this.bytes > this.maxBytes && only) {
      // One chunk larger than the whole buffer: keep its tail (whole base64 quads for binary).
      const excess = this.bytes - this.maxBytes;
      const cut = only.encoding === "base64" ? Math.ceil(excess / 4) * 4 : excess;
      const kept = { ...only, data: only.data.slice(cut) };
      this.droppedBytes += rawBytes(only) - rawBytes(kept);
      this.events[0] = kept;
      this.bytes = kept.data.length;
    }
  }

  /** What a client attaching now gets first: a drop marker when needed, then the kept output. */
  replay(commandId: string): CommandEvent[] {
    const head: CommandEvent[] =
      this.droppedBytes > 0 ? [{ type: "output_dropped", command_id: commandId, bytes: this.droppedBytes }] : [];
    return [...head, ...this.events];
  }
}

function rawBytes(event: OutputEvent): number {
  return event.encoding === "base64" ? Buffer.from(event.data, "base64").length : Buffer.byteLength(event.data);
}
