import { spawn, type ChildProcessByStdio } from "node:child_process";
import { createServer, type AddressInfo, type Server, type Socket } from "node:net";
import type { Readable, Writable } from "node:stream";
import { fileURLToPath } from "node:url";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { BothyError } from "@bothy/protocol";
import { AgentClient } from "../../server/src/agent/agent-client.ts";

/** The bundled agent over pipes; here its loopback is the host's, so a server of this test is "inside". */
const AGENT = fileURLToPath(new URL("../dist/agent.mjs", import.meta.url));

let child: ChildProcessByStdio<Writable, Readable, null>;
let agent: AgentClient;
let server: Server;
let port: number;
let accepted: Socket[];

beforeEach(async () => {
  child = spawn(process.execPath, [AGENT], { stdio: ["pipe", "pipe", "inherit"] });
  agent = new AgentClient(child.stdout, child.stdin);
  await agent.handshake(10_000);
  accepted = [];
  // Echoes what it gets, upper-cased, and half-closes when the peer does.
  server = createServer({ allowHalfOpen: true }, (socket) => {
    accepted.push(socket);
    socket.on("data", (c: Buffer) => socket.write(c.toString().toUpperCase()));
    socket.on("end", () => socket.end("bye"));
    socket.on("error", () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  port = (server.address() as AddressInfo).port;
});

afterEach(async () => {
  child.kill("SIGKILL");
  await new Promise((r) => server.close(r));
});

async function readAll(stream: Readable): Promise<string> {
  let text = "";
  for await (const chunk of stream) text += (chunk as Buffer).toString();
  return text;
}

describe("TCP connections through the agent", () => {
  it("lists a listening port with its address", async () => {
    expect(await agent.listPorts()).toContainEqual({ port, address: "127.0.0.1" });
  });

  it("relays bytes both ways and passes half-closes on", async () => {
    const stream = await agent.openTcp(port);
    stream.write("hello ");
    stream.end("there");
    expect(await readAll(stream)).toBe("HELLO THEREbye");
  });

  it("answers port_not_listening when nothing listens", async () => {
    await new Promise((r) => server.close(r));
    const err = await agent.openTcp(port).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BothyError);
    expect((err as BothyError).code).toBe("port_not_listening");
    server = createServer().listen(0); // for afterEach
  });

  it("resets the connection inside when the host's end is destroyed", async () => {
    const stream = await agent.openTcp(port);
    stream.write("x");
    await new Promise<void>((r) => stream.once("data", () => r()));
    const inside = accepted[0] as Socket;
    const closed = new Promise<void>((r) => inside.once("close", () => r()));
    stream.destroy();
    await closed;
    // The agent still serves other requests.
    expect(await agent.listPorts()).toContainEqual({ port, address: "127.0.0.1" });
  });

  it("fails open connections when the channel closes", async () => {
    const stream = await agent.openTcp(port);
    const failed = new Promise<unknown>((r) => stream.once("error", r));
    agent.close(new BothyError("agent_unavailable", "test closes the channel"));
    expect(await failed).toMatchObject({ code: "agent_unavailable" });
  });
});
