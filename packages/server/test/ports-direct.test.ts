/**
 * Ports of sandboxes that have a network: the server dials the sandbox's own address (port-dialer.ts)
 * instead of carrying the bytes over the guest channel, and falls back to the channel for a server
 * that listens on the sandbox's loopback only. Run against the network lab (helpers/net-topology.ts):
 * the server and its sandboxes live in namespaces this test made; nothing leaves the machine.
 *
 * The attacker's side: a sandbox's code, while the host holds a connection into it, still reaches
 * neither the host nor another sandbox; a port URL reaches only the sandbox it names.
 */
import { createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import WebSocket from "ws";
import { startBackgroundCommand } from "./helpers/background.ts";
import { api, createSandbox, putSandboxFile, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useNetLab } from "./helpers/net-lab.ts";
import { ipv4Of, probe, type Outcome } from "./helpers/net-probe.ts";
import { HOST_LAN_ADDR, HOST_PORT } from "./helpers/net-topology.ts";
import { readUntil } from "./helpers/read-until.ts";

const PORT_SERVER = readFileSync(new URL("./fixtures/port-server.mjs", import.meta.url), "utf8");
const OPEN_PORT = 8000;
const LOOPBACK_PORT = 8001;
const root = process.getuid?.() === 0;
const IPV4 = /^\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}$/;
/** The host's end of a sandbox's /30: the address below the sandbox's own. */
const gatewayOf = (addr: string): string => addr.replace(/\d+$/, (n) => String(Number(n) - 1));

/** Refused by the filter or the kernel (a reset or an ICMP reject), never a connection. */
function refused(o: Outcome | undefined, what: string): void {
  expect(o, what).toBeDefined();
  expect(o?.ok, `${what} should be refused: ${JSON.stringify(o)}`).toBe(false);
  expect(o?.err, `${what} should fail fast, not time out: ${JSON.stringify(o)}`).not.toBe("timeout");
}

/** `bothy_port_connections_total` by route, from the server's metrics. */
async function portRoutes(base: string): Promise<Record<string, number>> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^bothy_port_connections_total\{path="(\w+)"(?:,why="(\w+)")?\} (\d+)$/gm))
    out[m[2] ?? m[1]!] = Number(m[3]);
  return out;
}

async function waitListening(base: string, id: string, port: number): Promise<void> {
  for (let i = 0; i < 600; i++) {
    const res = await api(base, "GET", `/sandboxes/${id}/ports`);
    if ((res.json["ports"] as Array<{ port: number }> | undefined)?.some((p) => p.port === port)) return;
    await new Promise((r) => setTimeout(r, 100)); // the poll's pace
  }
  throw new Error(`port ${port} never started listening in ${id}`);
}

async function startPortServer(base: string, id: string, port: number, host: string): Promise<void> {
  await putSandboxFile(base, id, "/workspace/port-server.mjs", PORT_SERVER);
  await startBackgroundCommand(base, id, `node /workspace/port-server.mjs ${port} ${host} > /tmp/srv-${port}.log 2>&1`);
  await waitListening(base, id, port);
}

function wsEcho(url: string, messages: string[]): Promise<string[]> {
  const ws = new WebSocket(url);
  return new Promise<string[]>((resolve, reject) => {
    const got: string[] = [];
    ws.on("open", () => ws.send(messages[0]!));
    ws.on("message", (data) => {
      got.push(data.toString());
      if (got.length < messages.length) ws.send(messages[got.length]!);
      else ws.close();
    });
    ws.on("close", () => resolve(got));
    ws.on("error", reject);
  });
}

describe.skipIf(!root)("ports over the sandbox's own network", () => {
  const lab = useNetLab("ports");
  const { topo, made } = lab;

  describe.each(testDrivers())("$name", (d) => {
    // Emulated QEMU moves a few hundred KB/s through its one CPU: smaller bodies there.
    const BODY_BYTES = d.name === "qemu" ? 200_000 : 5_000_000;
    let a = "";
    let b = "";
    let aAddr = "";
    let bAddr = "";
    const portUrl = (id: string, port: number, rest = ""): string => `${lab.base}/sandboxes/${id}/ports/${port}${rest}`;

    it(
      driverTitle(d, "dials a server on the sandbox's address directly; one on its loopback only over the channel"),
      async () => {
        [a, b] = await Promise.all([
          createSandbox(lab.base, { driver: d.name }),
          createSandbox(lab.base, { driver: d.name }),
        ]);
        made.push(a, b);
        for (const [id, addr] of [
          [a, "a"],
          [b, "b"],
        ] as const)
          await runCommand(lab.base.replace(/^http/, "ws"), id, {
            cmd: `mkdir -p /workspace/www && echo ${addr}:${id} > /workspace/www/id.txt`,
          });
        await Promise.all([
          startPortServer(lab.base, a, OPEN_PORT, "0.0.0.0"),
          startPortServer(lab.base, b, OPEN_PORT, "0.0.0.0"),
        ]);
        await startPortServer(lab.base, a, LOOPBACK_PORT, "127.0.0.1");
        // A's address as A sees it; B's from the host's end its app sees (one probe: a Node start
        // each is slow under emulation).
        aAddr = ipv4Of(await probe(lab.base, a, { self: { tcp: ["127.0.0.1", OPEN_PORT] } }));
        const aGateway = gatewayOf(aAddr);
        // The lab's server is shared by every driver's run of this file: its counters are compared, not read.
        const start = await portRoutes(lab.base);
        const bPeer = (await fetch(portUrl(b, OPEN_PORT, "/hello"))).headers.get("x-seen-peer") ?? "";
        expect(bPeer).toMatch(IPV4);
        expect(bPeer).not.toBe(aGateway);
        bAddr = bPeer.replace(/\d+$/, (n) => String(Number(n) + 1));

        const before = await portRoutes(lab.base);
        expect(before["direct"], "B's GET above").toBe((start["direct"] ?? 0) + 1);
        const hello = await fetch(portUrl(a, OPEN_PORT, "/hello?x=1"));
        expect(hello.status).toBe(200);
        expect(await hello.text()).toBe("hello from inside\n");
        // The app sees the host's end of the sandbox's own link: the connection came over the network.
        expect(hello.headers.get("x-seen-peer")).toBe(aGateway);
        expect(hello.headers.get("x-seen-host")).toBe(`localhost:${OPEN_PORT}`);
        expect(hello.headers.get("x-seen-path")).toBe("/hello?x=1");
        const afterDirect = await portRoutes(lab.base);
        expect(afterDirect["direct"]).toBe((before["direct"] ?? 0) + 1);
        expect(afterDirect["refused"]).toBe(before["refused"]);

        // Bound to 127.0.0.1 only (as the code interpreter's server is): the address refuses it, the channel serves it.
        const loopback = await fetch(portUrl(a, LOOPBACK_PORT, "/hello"));
        expect(loopback.status).toBe(200);
        expect(loopback.headers.get("x-seen-peer")).toBe("127.0.0.1");
        expect((await portRoutes(lab.base))["refused"]).toBe((before["refused"] ?? 0) + 1);

        // Nothing listens at all: the channel's answer, as before.
        const nobody = await fetch(portUrl(a, 9, "/"));
        expect(nobody.status).toBe(502);
        expect(((await nobody.json()) as { code: string }).code).toBe("port_not_listening");
      },
      600_000,
    );

    it(
      driverTitle(d, "streams bodies both ways and relays WebSockets and raw tunnels on the direct path"),
      async () => {
        expect([aAddr, bAddr], "the sandboxes' addresses, found by the first test").toEqual([
          expect.stringMatching(IPV4),
          expect.stringMatching(IPV4),
        ]);
        const before = await portRoutes(lab.base);
        const body = randomBytes(BODY_BYTES);
        const echoed = await fetch(portUrl(a, OPEN_PORT, "/echo"), { method: "POST", body });
        expect(await echoed.json()).toEqual({
          method: "POST",
          size: body.length,
          sha256: createHash("sha256").update(body).digest("hex"),
        });
        const down = await fetch(portUrl(a, OPEN_PORT, `/bytes?n=${BODY_BYTES}`));
        const hash = createHash("sha256");
        let size = 0;
        for await (const chunk of down.body as unknown as AsyncIterable<Uint8Array>) {
          hash.update(chunk);
          size += chunk.length;
        }
        expect(size).toBe(BODY_BYTES);
        expect(hash.digest("hex")).toBe(createHash("sha256").update(Buffer.alloc(BODY_BYTES, 97)).digest("hex"));

        const wsBase = lab.base.replace(/^http/, "ws");
        expect(await wsEcho(`${wsBase}/sandboxes/${a}/ports/${OPEN_PORT}/ws`, ["ping", "x".repeat(3000)])).toEqual([
          "ping",
          "x".repeat(3000),
        ]);
        // The raw tunnel (`bothy port --forward`): HTTP written by hand, bytes only.
        const tunnel = new WebSocket(`${wsBase}/sandboxes/${a}/tunnel/${OPEN_PORT}`);
        const answer = await new Promise<string>((resolve, reject) => {
          let got = "";
          tunnel.on("open", () =>
            tunnel.send(Buffer.from("GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")),
          );
          tunnel.on("message", (data: Buffer) => (got += data.toString()));
          tunnel.on("close", () => resolve(got));
          tunnel.on("error", reject);
        });
        expect(answer).toMatch(/^HTTP\/1\.1 200 OK/);
        expect(answer).toContain(`x-seen-peer: ${gatewayOf(aAddr)}`);
        expect((await portRoutes(lab.base))["direct"]).toBe((before["direct"] ?? 0) + 4);
      },
    );

    it(driverTitle(d, "a port URL reaches only the sandbox it names, whatever the request says"), async () => {
      expect([aAddr, bAddr], "the sandboxes' addresses, found by the first test").toEqual([
        expect.stringMatching(IPV4),
        expect.stringMatching(IPV4),
      ]);
      expect(await (await fetch(portUrl(a, OPEN_PORT, "/www/id.txt"))).text()).toBe(`a:${a}\n`);
      expect(await (await fetch(portUrl(b, OPEN_PORT, "/www/id.txt"))).text()).toBe(`b:${b}\n`);
      // Headers that name another address change nothing: the address is the named sandbox's own.
      const steered = await fetch(portUrl(a, OPEN_PORT, "/www/id.txt"), {
        headers: { "x-forwarded-host": `${bAddr}:${OPEN_PORT}`, "x-real-ip": bAddr, forwarded: `for=${bAddr}` },
      });
      expect(await steered.text()).toBe(`a:${a}\n`);
      // A port that is no port is refused before anything is dialed.
      for (const port of [`${OPEN_PORT}@${bAddr}`, "0", "65536", `${bAddr}:${OPEN_PORT}`]) {
        const res = await fetch(`${lab.base}/sandboxes/${a}/ports/${encodeURIComponent(port)}/www/id.txt`);
        expect(res.status, port).toBe(400);
        expect(((await res.json()) as { code: string }).code).toBe("invalid_request");
      }
      // A sandbox id that is not one of this server's sandboxes gets nothing.
      const unknown = await fetch(`${lab.base}/sandboxes/sbx_${"a".repeat(20)}/ports/${OPEN_PORT}/www/id.txt`);
      expect(unknown.status).toBe(404);
    });

    it(
      driverTitle(
        d,
        "while the host holds a connection into it, the sandbox still reaches neither the host nor another sandbox",
      ),
      async () => {
        expect([aAddr, bAddr], "the sandboxes' addresses, found by the first test").toEqual([
          expect.stringMatching(IPV4),
          expect.stringMatching(IPV4),
        ]);
        // A direct connection stays open for the whole probe: its conntrack entry exists meanwhile.
        const held = await fetch(portUrl(a, OPEN_PORT, "/stream"));
        const reader = (held.body as ReadableStream<Uint8Array>).getReader();
        await readUntil(reader, "part one\n");
        const gateway = gatewayOf(aAddr);
        const apiPort = Number(new URL(lab.base).port);
        const fromA = await probe(lab.base, a, {
          gatewayListener: { tcp: [gateway, HOST_PORT] },
          gatewayApi: { tcp: [gateway, apiPort] },
          hostApi: { tcp: [topo.ctlHostAddr, apiPort] },
          hostLan: { tcp: [HOST_LAN_ADDR, HOST_PORT] },
          peerPort: { tcp: [bAddr, OPEN_PORT] },
        });
        for (const k of ["gatewayListener", "gatewayApi", "hostApi", "hostLan", "peerPort"])
          refused(fromA.results[k], k);
        const fromB = await probe(lab.base, b, {
          peerPort: { tcp: [aAddr, OPEN_PORT] },
          gatewayListener: { tcp: [gatewayOf(bAddr), HOST_PORT] },
        });
        refused(fromB.results["peerPort"], "another sandbox's port");
        refused(fromB.results["gatewayListener"], "the host from the other sandbox");
        // The held connection itself was not disturbed by any of it.
        expect(await (await fetch(portUrl(a, OPEN_PORT, "/release"))).text()).toBe("released\n");
        expect(await readUntil(reader, "part two\n")).toContain("part two\n");
      },
      300_000,
    );

    it(
      driverTitle(d, "ends a direct connection when its sandbox is deleted, and leaves no network behind"),
      async () => {
        const res = await fetch(portUrl(b, OPEN_PORT, "/stream"));
        const reader = (res.body as ReadableStream<Uint8Array>).getReader();
        await readUntil(reader, "part one\n");
        expect((await api(lab.base, "DELETE", `/sandboxes/${b}?wait=true`)).status).toBe(200);
        await expect(readUntil(reader, "part two\n")).rejects.toThrow();
        const left = await topo.bothyObjects();
        expect(left.chains).not.toContain(b);
        expect(left.links.filter((l) => l.endsWith(b.slice(4, 12)))).toEqual([]);
      },
    );
  });
});
