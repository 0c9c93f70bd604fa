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
import { readdir, readFile } from "node:fs/promises";
import { connect } from "node:net";
import { describe, expect, it } from "vitest";
import WebSocket from "ws";
import { startBackgroundCommand } from "./helpers/background.ts";
import { api, createSandbox, putSandboxFile, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useNetLab } from "./helpers/net-lab.ts";
import { ipv4Of, probe, type Outcome } from "./helpers/net-probe.ts";
import { HOST_LAN_ADDR, HOST_PORT, type NetTopology } from "./helpers/net-topology.ts";
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

/** The host processes of a sandbox (runsc's or QEMU's), found by its id on their command lines. */
async function sandboxPids(id: string): Promise<number[]> {
  const pids: number[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const argv = await readFile(`/proc/${entry}/cmdline`, "utf8").catch(() => "");
    if (argv.includes(id) && /runsc|qemu-system/.test(argv)) pids.push(Number(entry));
  }
  return pids;
}

/** TCP connections the server's namespace holds open to `addr:port` (the kernel's view, `ss`). */
async function established(topo: NetTopology, addr: string, port: number): Promise<number> {
  const out = await topo.inHost("ss", ["-Htn", "state", "established", "dst", addr, "dport", "=", `:${port}`]);
  return out.split("\n").filter((l) => l.trim() !== "").length;
}

/** Polls `check` until it holds or `ms` pass: the deadline only bounds a failure. */
async function until(what: string, check: () => Promise<boolean>, ms = 30_000): Promise<void> {
  for (const end = Date.now() + ms; !(await check());) {
    if (Date.now() > end) throw new Error(`${what}: not so after ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100)); // the poll's pace
  }
}

interface RawAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/**
 * Writes `requests` (raw HTTP/1.1, pipelined) on ONE connection to the server and reads one answer
 * for each (every answer here has a Content-Length): what a client that keeps its connection and
 * changes the URL between requests gets.
 */
function onOneConnection(base: string, requests: string[]): Promise<RawAnswer[]> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const socket = connect({ host: hostname, port: Number(port) });
    let buf = Buffer.alloc(0);
    const answers: RawAnswer[] = [];
    socket.on("connect", () => socket.write(requests.join("")));
    socket.on("data", (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      for (;;) {
        const end = buf.indexOf("\r\n\r\n");
        if (end < 0) return;
        const [statusLine = "", ...lines] = buf.subarray(0, end).toString("latin1").split("\r\n");
        const headers = Object.fromEntries(
          lines.map((l) => [l.slice(0, l.indexOf(":")).toLowerCase(), l.slice(l.indexOf(":") + 1).trim()]),
        );
        const length = Number(headers["content-length"] ?? NaN);
        if (!Number.isInteger(length)) return reject(new Error(`an answer without Content-Length: ${statusLine}`));
        if (buf.length < end + 4 + length) return;
        const body = buf.subarray(end + 4, end + 4 + length).toString("utf8");
        answers.push({ status: Number(statusLine.split(" ")[1]), headers, body });
        buf = buf.subarray(end + 4 + length);
        if (answers.length === requests.length) {
          socket.destroy();
          resolve(answers);
          return;
        }
      }
    });
    socket.on("error", reject);
    socket.on("close", () => reject(new Error(`the server closed after ${answers.length} answers`)));
  });
}

describe.skipIf(!root)("ports over the sandbox's own network", () => {
  const lab = useNetLab("ports");
  const { topo, made } = lab;

  describe.each(testDrivers())("$name", (d) => {
    // What differs by driver is the link (a tap for QEMU, a veth for gVisor) and its rules: one VM,
    // one test for those. The proxy's own paths and checks are the same code, tested on gVisor below.
    if (d.name === "qemu") {
      it(
        driverTitle(
          d,
          "dials the VM's address over its tap; the VM reaches no host address meanwhile; a delete ends it",
        ),
        async () => {
          const vm = await createSandbox(lab.base, { driver: d.name });
          made.push(vm);
          await startPortServer(lab.base, vm, OPEN_PORT, "0.0.0.0");
          const before = await portRoutes(lab.base);
          const held = await fetch(`${lab.base}/sandboxes/${vm}/ports/${OPEN_PORT}/stream`);
          const reader = (held.body as ReadableStream<Uint8Array>).getReader();
          await readUntil(reader, "part one\n");
          expect((await portRoutes(lab.base))["direct"]).toBe((before["direct"] ?? 0) + 1);
          const hello = await fetch(`${lab.base}/sandboxes/${vm}/ports/${OPEN_PORT}/hello`);
          const gateway = hello.headers.get("x-seen-peer") ?? "";
          expect(gateway).toMatch(IPV4);
          const apiPort = Number(new URL(lab.base).port);
          const fromVm = await probe(lab.base, vm, {
            gatewayListener: { tcp: [gateway, HOST_PORT] },
            gatewayApi: { tcp: [gateway, apiPort] },
            hostApi: { tcp: [topo.ctlHostAddr, apiPort] },
            hostLan: { tcp: [HOST_LAN_ADDR, HOST_PORT] },
          });
          for (const k of ["gatewayListener", "gatewayApi", "hostApi", "hostLan"]) refused(fromVm.results[k], k);
          expect((await api(lab.base, "DELETE", `/sandboxes/${vm}?wait=true`)).status).toBe(200);
          await expect(readUntil(reader, "part two\n")).rejects.toThrow();
          const vmAddr = gateway.replace(/\d+$/, (n) => String(Number(n) + 1));
          await until(
            "no host connection to the deleted VM's address",
            async () => (await established(topo, vmAddr, OPEN_PORT)) === 0,
          );
        },
        900_000,
      );
      return;
    }
    const BODY_BYTES = 5_000_000;
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
        // The WebSocket and the tunnel each dialed; the two HTTP requests dialed or reused a kept-alive
        // connection (port-pool.ts). None went over the channel.
        const after = await portRoutes(lab.base);
        expect(after["direct"]).toBeGreaterThanOrEqual((before["direct"] ?? 0) + 2);
        expect(after["direct"]).toBeLessThanOrEqual((before["direct"] ?? 0) + 4);
        for (const why of ["refused", "unreachable", "no_network"]) expect(after[why], why).toBe(before[why]);
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
      driverTitle(d, "one client connection cannot carry a link for one sandbox's port to another sandbox or port"),
      async () => {
        expect([aAddr, bAddr], "the sandboxes' addresses, found by the first test").toEqual([
          expect.stringMatching(IPV4),
          expect.stringMatching(IPV4),
        ]);
        // The attacker holds a link to A's port 8000 (its token, sent as the link cookie) and keeps one
        // connection to the server, asking on it, pipelined, for B's port, A's other port, and A's again.
        const link = await api(lab.base, "POST", `/sandboxes/${a}/port-links/${OPEN_PORT}`, {});
        const token = new URL(String(link.json["url"])).searchParams.get("token") ?? "";
        expect(token).not.toBe("");
        const host = new URL(lab.base).host;
        const get = (id: string, port: number): string =>
          `GET /sandboxes/${id}/ports/${port}/hello HTTP/1.1\r\nHost: ${host}\r\nCookie: bothy_link=${token}\r\n\r\n`;
        const answers = await onOneConnection(lab.base, [
          get(a, OPEN_PORT),
          get(b, OPEN_PORT),
          get(a, LOOPBACK_PORT),
          get(a, OPEN_PORT),
        ]);
        expect(answers.map((x) => x.status)).toEqual([200, 401, 401, 200]);
        expect(answers[0]?.headers["x-seen-peer"]).toBe(gatewayOf(aAddr));
        expect(answers[3]?.headers["x-seen-peer"]).toBe(gatewayOf(aAddr));
        for (const refusedAnswer of [answers[1], answers[2]]) {
          expect(refusedAnswer?.body).not.toContain("hello from inside");
          expect(JSON.parse(refusedAnswer?.body ?? "{}")).toMatchObject({ code: "unauthorized" });
        }
      },
    );

    it(
      driverTitle(
        d,
        "keeps a port's connection alive between requests; a sandbox that dies takes its connections along, and a new sandbox at the same address gets its own",
      ),
      async () => {
        const c = await createSandbox(lab.base, { driver: d.name });
        made.push(c);
        await startPortServer(lab.base, c, OPEN_PORT, "0.0.0.0");
        // Two GETs in a row on one kept-alive connection into the sandbox: the app sees one peer port.
        // (Polled: an idle connection the pool closed in between makes the pair differ.)
        let cGateway = "";
        await until("two GETs on one kept-alive connection", async () => {
          const [one, two] = [
            await fetch(portUrl(c, OPEN_PORT, "/hello")),
            await fetch(portUrl(c, OPEN_PORT, "/hello")),
          ];
          cGateway = one.headers.get("x-seen-peer") ?? "";
          return one.headers.get("x-seen-peer-port") === two.headers.get("x-seen-peer-port");
        });
        expect(cGateway).toMatch(IPV4);
        const cAddr = cGateway.replace(/\d+$/, (n) => String(Number(n) + 1));
        // One connection busy (a response in flight), and the pool's idle one from the GETs above.
        const held = await fetch(portUrl(c, OPEN_PORT, "/stream"));
        const reader = (held.body as ReadableStream<Uint8Array>).getReader();
        await readUntil(reader, "part one\n");
        expect(await established(topo, cAddr, OPEN_PORT)).toBeGreaterThanOrEqual(1);

        // The sandbox dies outright (its runsc processes killed): its network stack says no goodbye, so
        // only the host can end these connections, and must, with the run they belong to.
        const pids = await sandboxPids(c);
        expect(pids.length).toBeGreaterThan(0);
        for (const pid of pids) process.kill(pid, "SIGKILL");
        await until(
          "the server to notice the death",
          async () => (await api(lab.base, "GET", `/sandboxes/${c}`)).json["state"] === "stopped",
        );
        // By then its run's connections are closed (TCP keep-alive would notice a dead peer only
        // seconds later, and a connection busy with a response not at all).
        expect(await established(topo, cAddr, OPEN_PORT)).toBe(0);
        await expect(readUntil(reader, "part two\n")).rejects.toThrow();
        expect((await api(lab.base, "DELETE", `/sandboxes/${c}?wait=true`)).status).toBe(200);

        // The next sandbox takes the freed address (the lowest free one): its port answers from it,
        // on a connection of its own.
        const next = await createSandbox(lab.base, { driver: d.name });
        made.push(next);
        await runCommand(lab.base.replace(/^http/, "ws"), next, {
          cmd: `mkdir -p /workspace/www && echo next:${next} > /workspace/www/id.txt`,
        });
        await startPortServer(lab.base, next, OPEN_PORT, "0.0.0.0");
        const hello = await fetch(portUrl(next, OPEN_PORT, "/hello"));
        expect(hello.status).toBe(200);
        expect(hello.headers.get("x-seen-peer"), "the new sandbox has the deleted one's address").toBe(cGateway);
        expect(await (await fetch(portUrl(next, OPEN_PORT, "/www/id.txt"))).text()).toBe(`next:${next}\n`);
        expect((await api(lab.base, "DELETE", `/sandboxes/${next}?wait=true`)).status).toBe(200);
        await until(
          "no host connection to the second sandbox's address",
          async () => (await established(topo, cAddr, OPEN_PORT)) === 0,
        );
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
