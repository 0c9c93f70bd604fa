import { expect } from "vitest";
import WebSocket from "ws";
import type { BothyEvent, CommandEvent } from "@bothy/protocol";
import { Sandbox } from "@bothy/sdk";

/** Starts a background command through the SDK and answers its id once started; the socket is let go at once. */
export async function startBackgroundCommand(baseUrl: string, sandboxId: string, cmd: string): Promise<string> {
  const sandbox = await Sandbox.connect(sandboxId, { baseUrl });
  const handle = await sandbox.commands.run(cmd, { background: true });
  handle.disconnect();
  return handle.commandId;
}

/** Re-attaches to a command and collects everything until the server closes the socket. */
export function attachCommand(wsBase: string, sandboxId: string, commandId: string): Promise<CommandEvent[]> {
  return new Promise((resolve, reject) => {
    const events: CommandEvent[] = [];
    const ws = new WebSocket(`${wsBase}/sandboxes/${sandboxId}/commands/${commandId}`);
    ws.on("message", (data) => events.push(JSON.parse(data.toString()) as CommandEvent));
    ws.on("close", () => resolve(events));
    ws.on("error", reject);
  });
}

/** Reads SSE from /events until `until` says stop. */
export function readEventStream(
  base: string,
  query: string,
  until: (events: BothyEvent[]) => boolean,
  headers: Record<string, string> = {},
): Promise<BothyEvent[]> {
  const controller = new AbortController();
  return fetch(`${base}/events${query}`, { headers, signal: controller.signal }).then(async (res) => {
    expect(res.headers.get("content-type")).toContain("text/event-stream");
    const events: BothyEvent[] = [];
    const decoder = new TextDecoder();
    let text = "";
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      text += decoder.decode(chunk, { stream: true });
      let cut;
      while ((cut = text.indexOf("\n\n")) >= 0) {
        const block = text.slice(0, cut);
        text = text.slice(cut + 2);
        const data = block.split("\n").find((l) => l.startsWith("data: "));
        if (data) events.push(JSON.parse(data.slice(6)) as BothyEvent);
      }
      if (until(events)) break;
    }
    controller.abort();
    return events;
  });
}
