import { createServer, get, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { RELAY_HIGH_WATER, relayBody } from "../src/api/body-relay.ts";

const CHUNK = 64 * 1024;

/** Deadlines, not sleeps: resolves once `check` holds, polling every 20 ms, or throws after `ms`. */
async function until(check: () => boolean, what: string, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * An app that writes `total` bytes in 64 KiB chunks as fast as its socket takes them (counting
 * what its socket took), and a proxy in front of it that relays the body with relayBody, as the port
 * proxy does; both on loopback in this process.
 */
async function rig(total: number): Promise<{
  url: string;
  written: () => number;
  upstream: Promise<IncomingMessage>;
  response: Promise<ServerResponse>;
  close: () => Promise<void>;
}> {
  let written = 0;
  const app = createServer((_req, res) => {
    res.writeHead(200, { "content-length": String(total) });
    let left = total;
    const more = (): void => {
      while (left > 0) {
        const part = Buffer.alloc(Math.min(left, CHUNK), 97);
        left -= part.length;
        if (!res.write(part, () => (written += part.length))) return void res.once("drain", more);
      }
      res.end();
    };
    more();
  });
  const listen = async (server: Server): Promise<number> => {
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    return (server.address() as AddressInfo).port;
  };
  const appPort = await listen(app);
  let gotUpstream: (m: IncomingMessage) => void = () => undefined;
  let gotResponse: (r: ServerResponse) => void = () => undefined;
  const upstream = new Promise<IncomingMessage>((r) => (gotUpstream = r));
  const response = new Promise<ServerResponse>((r) => (gotResponse = r));
  const proxy = createServer((_req, res) => {
    get({ host: "127.0.0.1", port: appPort, path: "/", agent: false }, (up) => {
      gotUpstream(up);
      gotResponse(res);
      res.writeHead(200, { "content-length": String(total) });
      relayBody(up, res);
    });
  });
  const proxyPort = await listen(proxy);
  const close = async (): Promise<void> => {
    for (const server of [proxy, app]) {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    }
  };
  return { url: `http://127.0.0.1:${proxyPort}/`, written: () => written, upstream, response, close };
}

describe("port proxy: relaying a body", () => {
  let done: (() => Promise<void>) | undefined;
  afterEach(async () => {
    await done?.();
    done = undefined;
  });

  it("delivers the whole body, pausing its source rarely, not after every chunk as a pipe does", async () => {
    const total = 32 * 1024 * 1024;
    const r = await rig(total);
    done = r.close;
    let received = 0;
    const client = new Promise<void>((resolve, reject) => {
      get(r.url, (res) => {
        res.on("data", (c: Buffer) => (received += c.length));
        res.on("end", resolve);
        res.on("error", reject);
      }).on("error", reject);
    });
    const up = await r.upstream;
    let chunks = 0;
    let pauses = 0;
    up.on("data", () => (chunks += 1));
    up.on("pause", () => (pauses += 1));
    await client;
    expect(received).toBe(total);
    // A pipe pauses after every 64 KiB chunk (its writes return false past 16 KiB); the relay only
    // when the client is RELAY_HIGH_WATER behind.
    expect(chunks).toBeGreaterThan(0);
    expect(pauses).toBeLessThan(chunks / 4);
  });

  it("holds back the app for a client that does not read, with a bounded amount held in the proxy", async () => {
    const total = 64 * 1024 * 1024;
    const r = await rig(total);
    done = r.close;
    let client: IncomingMessage | undefined;
    get(r.url, (res) => {
      client = res;
      res.pause();
    });
    const response = await r.response;
    await until(() => client !== undefined, "the response head");
    // Wait until the app's progress stands still: every buffer on the way is full.
    let last = -1;
    let still = 0;
    await until(() => {
      const now = r.written();
      still = now === last && now > 0 ? still + 1 : 0;
      last = now;
      return still >= 10;
    }, "the app to be held back");
    expect(r.written()).toBeLessThan(total);
    expect(response.writableLength).toBeLessThan(RELAY_HIGH_WATER + CHUNK);
    client?.resume();
  });
});
