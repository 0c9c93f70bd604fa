import { once } from "node:events";
import { createServer, type AddressInfo } from "node:net";
import { connect } from "node:tls";
import { describe, expect, it } from "vitest";
import { peekClientHello } from "../src/gateway/tls-client-hello.ts";

/** The first bytes Node's own TLS client sends, with or without a server name. */
async function realHello(servername: string | undefined): Promise<Buffer> {
  const server = createServer();
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const got = new Promise<Buffer>((resolve) =>
    server.once("connection", (s) => {
      s.once("data", (d: Buffer) => {
        resolve(d);
        s.destroy();
      });
    }),
  );
  const { port } = server.address() as AddressInfo;
  const client = connect({ host: "127.0.0.1", port, ...(servername ? { servername } : {}) });
  client.on("error", () => undefined);
  const hello = await got;
  client.destroy();
  server.close();
  return hello;
}

describe("peekClientHello", () => {
  it("reads the SNI of a real ClientHello, lower-cased, and its record length", async () => {
    const hello = await realHello("API.Example.com");
    const peek = peekClientHello(hello);
    expect(peek).toEqual({ kind: "hello", sni: "api.example.com", recordLength: hello.length });
  });

  it("says a hello without a server name has none", async () => {
    // Node sends no SNI for an IP address.
    expect(peekClientHello(await realHello(undefined))).toMatchObject({ kind: "hello", sni: null });
  });

  it("asks for more bytes until the record is whole, at every split", async () => {
    const hello = await realHello("a.b.test");
    for (const n of [0, 1, 4, 5, 6, 40, hello.length - 1])
      expect(peekClientHello(hello.subarray(0, n))).toEqual({ kind: "incomplete" });
  });

  it("refuses what is not a TLS handshake, and a truncated or lying hello", async () => {
    expect(peekClientHello(Buffer.from("GET / HTTP/1.1\r\n\r\n"))).toMatchObject({ kind: "invalid" });
    expect(peekClientHello(Buffer.from([22, 3, 1, 0xff, 0xff]))).toMatchObject({ kind: "invalid" });
    const hello = Buffer.from(await realHello("x.test"));
    // A handshake length longer than the record.
    hello.writeUInt8(0xff, 6);
    expect(peekClientHello(hello)).toMatchObject({ kind: "invalid", reason: "truncated ClientHello" });
    const notHello = Buffer.from([22, 3, 1, 0, 4, 2, 0, 0, 0]);
    expect(peekClientHello(notHello)).toMatchObject({ kind: "invalid", reason: "not a ClientHello" });
  });
});
