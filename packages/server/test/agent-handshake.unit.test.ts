import { PassThrough } from "node:stream";
import { BothyError, encodeFrame, FrameDecoder, PROTOCOL_GENERATION } from "@bothy/protocol";
import { describe, expect, it } from "vitest";
import { AgentClient } from "../src/agent/agent-client.ts";

describe("agent handshake", () => {
  // Found by the lifecycle model test: its in-memory guest answered a resync in the same turn,
  // before the client listened for the hello, and the handshake never ended.
  it("a resync answered at once still completes the handshake", async () => {
    const toHost = new PassThrough();
    const fromHost = new PassThrough();
    const decoder = new FrameDecoder();
    fromHost.on("data", (chunk: Buffer) => {
      for (const frame of decoder.push(chunk))
        if ((frame.header as { t: string }).t === "resync")
          toHost.write(encodeFrame({ t: "hello", gen: PROTOCOL_GENERATION, agent: "test", pid: 1 }));
    });
    const agent = new AgentClient(toHost, fromHost);
    try {
      await agent.handshake(60_000, undefined, true);
      expect(agent.isClosed).toBe(false);
    } finally {
      agent.close(new BothyError("agent_unavailable", "Test over."));
    }
  });
});
