/**
 * The webhook against a receiver that takes requests and never answers (a real HTTP server on
 * loopback): the events waiting for it stay under a bound, and the overflow is reported once.
 */
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import type { BothyEvent } from "@bothy/protocol";
import type { ServerEvent } from "../src/events/server-events.ts";
import { WebhookSender } from "../src/events/webhook.ts";

let server: Server | undefined;
let sender: WebhookSender | undefined;

afterEach(async () => {
  sender?.close();
  server?.closeAllConnections();
  await new Promise((resolve) => server?.close(resolve));
});

describe("webhook", () => {
  it("holds a bounded backlog for a receiver that never answers, and says once that it drops", async () => {
    const held: IncomingMessage[] = [];
    server = createServer((req) => held.push(req)); // never answered
    await new Promise<void>((resolve) => server?.listen(0, "127.0.0.1", resolve));
    const logged: ServerEvent[] = [];
    sender = new WebhookSender({
      url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`,
      retryBaseMs: 1000,
      attempts: 1,
      timeoutMs: 60_000,
      maxWaiting: 50,
      log: (event, fields) => logged.push({ event, ...fields } as ServerEvent),
    });
    for (let seq = 1; seq <= 5000; seq++)
      sender.send({
        seq,
        type: "sandbox.created",
        sandbox_id: null,
        data: {},
        created_at: "",
      } as unknown as BothyEvent);
    expect(sender.backlog).toBe(50);
    expect(logged.filter((e) => e.event === "webhook_dropped")).toEqual([
      { event: "webhook_dropped", seq: 51, waiting: 50 },
    ]);
  });
});
