import { execFile, spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { connect } from "node:net";
import { fileURLToPath } from "node:url";
import { Sandbox } from "@bothy/sdk";
import { get as httpGet, type IncomingMessage } from "node:http";
import { afterAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { ANONYMOUS } from "../../../test/auth.ts";
import { startBackgroundCommand } from "./helpers/background.ts";
import { api, createSandbox, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { homeFilesHolding, SANDBOX_TREES } from "./helpers/host-state.ts";
import { linkSigner } from "./helpers/link-signer.ts";
import { useServerWithSandbox } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";
import { readUntil } from "./helpers/read-until.ts";

const PORT_SERVER = readFileSync(new URL("./fixtures/port-server.mjs", import.meta.url));
const NODE_PORT = 8000;
const LOOPBACK_PORT = 8001;
const PREVIEW_DOMAIN = "preview.test";
const BOTHY = fileURLToPath(new URL("../../cli/bin/bothy.js", import.meta.url));

/** GET with a Host header of our choosing (fetch sets its own). */
function getWithHost(
  base: string,
  host: string,
  path: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; headers: IncomingMessage["headers"]; body: string }> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    httpGet({ hostname, port, path, headers: { ...headers, host: `${host}:${port}` } }, (res) => {
      let body = "";
      res.on("data", (c: Buffer) => (body += c.toString()));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
      res.on("error", reject);
    }).on("error", reject);
  });
}

/** Waits until the sandbox lists `port` as listening (a server inside takes a moment to start). */
async function waitListening(ts: TestServer, id: string, port: number): Promise<void> {
  for (let i = 0; i < 600; i++) {
    const res = await api(ts.url, "GET", `/sandboxes/${id}/ports`);
    expect(res.status).toBe(200);
    if ((res.json["ports"] as Array<{ port: number }>).some((p) => p.port === port)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`port ${port} never started listening in ${id}`);
}

async function startPortServer(ts: TestServer, id: string, port = NODE_PORT, host = "0.0.0.0"): Promise<void> {
  const put = await fetch(`${ts.url}/sandboxes/${id}/files?path=/workspace/port-server.mjs`, {
    method: "PUT",
    body: PORT_SERVER,
    headers: { "content-type": "application/octet-stream" },
  });
  expect(put.status).toBe(200);
  await startBackgroundCommand(
    ts.url,
    id,
    `node /workspace/port-server.mjs ${port} ${host} > /tmp/srv-${port}.log 2>&1`,
  );
  await waitListening(ts, id, port);
}

/** How many TCP connections to `port` inside the sandbox are established (from its /proc/net/tcp). */
async function establishedTo(ts: TestServer, id: string, port: number): Promise<number> {
  const hex = port.toString(16).toUpperCase().padStart(4, "0");
  const r = await runCommand(ts.wsUrl, id, {
    cmd: `cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$2 ~ /:${hex}$/ && $4 == "01"' | wc -l`,
  });
  return Number(r.stdout.trim());
}

async function waitNoConnections(ts: TestServer, id: string, port: number): Promise<void> {
  for (let i = 0; i < 100; i++) {
    if ((await establishedTo(ts, id, port)) === 0) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  expect(await establishedTo(ts, id, port)).toBe(0);
}

for (const driver of testDrivers()) {
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "ports as URLs"), () => {
    let ts: TestServer;
    let id: string;
    // Emulated QEMU moves a few hundred KB/s through its one CPU: smaller bodies there.
    const BODY_BYTES = driver.name === "qemu" ? 200_000 : 5_000_000;

    useServerWithSandbox(
      driver.name,
      (server, sandbox) => {
        ts = server;
        id = sandbox;
      },
      { BOTHY_PREVIEW_DOMAIN: PREVIEW_DOMAIN },
    );
    const portUrl = (port: number, rest = ""): string => `${ts.url}/sandboxes/${id}/ports/${port}${rest}`;
    /** A second sandbox: a link's foreign target, then the one deleted under a stream (one boot for both). */
    let other = "";
    const otherSandbox = async (): Promise<string> => (other ||= await createSandbox(ts.url));
    afterAll(async () => {
      if (other) await api(ts.url, "DELETE", `/sandboxes/${other}`);
    });

    it("lists the ports servers listen on inside the sandbox", async () => {
      await startPortServer(ts, id);
      await startPortServer(ts, id, LOOPBACK_PORT, "127.0.0.1");
      await runCommand(ts.wsUrl, id, {
        cmd: "mkdir -p /workspace/www && echo 'a static file' > /workspace/www/index.txt",
      });
      const res = await api(ts.url, "GET", `/sandboxes/${id}/ports`);
      expect(res.json["ports"]).toEqual(
        expect.arrayContaining([
          { port: NODE_PORT, address: "0.0.0.0" },
          { port: LOOPBACK_PORT, address: "127.0.0.1" },
        ]),
      );
    });

    it("proxies GET to a server inside: path, query and a Host it accepts", async () => {
      const file = await fetch(portUrl(LOOPBACK_PORT, "/www/index.txt"));
      expect(file.status).toBe(200);
      expect(await file.text()).toBe("a static file\n");

      const hello = await fetch(portUrl(NODE_PORT, "/hello?x=1&y=%20z"));
      expect(hello.status).toBe(200);
      expect(await hello.text()).toBe("hello from inside\n");
      expect(hello.headers.get("x-seen-path")).toBe("/hello?x=1&y=%20z");
      expect(hello.headers.get("x-seen-host")).toBe(`localhost:${NODE_PORT}`);
      expect(hello.headers.get("x-seen-prefix")).toBe(`/sandboxes/${id}/ports/${NODE_PORT}`);

      const missing = await fetch(portUrl(NODE_PORT, "/nope"));
      expect(missing.status).toBe(404);
      expect(await missing.text()).toBe("no such page\n");
    });

    it("goes over the guest channel where the sandbox has no network (BOTHY_NETWORK=off here)", async () => {
      const routes = async (): Promise<string> =>
        (await (await fetch(`${ts.url}/metrics`)).text())
          .split("\n")
          .filter((l) => l.startsWith("bothy_port_connections_total{"))
          .join("\n");
      const count = (text: string, labels: string): number =>
        Number(new RegExp(`^bothy_port_connections_total\\{${labels}\\} (\\d+)$`, "m").exec(text)?.[1] ?? NaN);
      const before = await routes();
      const hello = await fetch(portUrl(NODE_PORT, "/hello"));
      expect(await hello.text()).toBe("hello from inside\n");
      // The app sees a loopback peer: the agent connected to it inside the sandbox.
      expect(hello.headers.get("x-seen-peer")).toBe("127.0.0.1");
      const after = await routes();
      expect(count(after, 'path="channel",why="no_network"')).toBe(
        count(before, 'path="channel",why="no_network"') + 1,
      );
      expect(count(after, 'path="direct"')).toBe(0);
    });

    it("passes a streamed response on as it is made, not when it ends", async () => {
      const res = await fetch(portUrl(NODE_PORT, "/stream"));
      expect(res.status).toBe(200);
      const reader = (res.body as ReadableStream<Uint8Array>).getReader();
      // The second part does not exist until /release is called, so the first arrived on its own.
      expect(await readUntil(reader, "part one\n")).toBe("part one\n");
      expect(await (await fetch(portUrl(NODE_PORT, "/release"))).text()).toBe("released\n");
      expect(await readUntil(reader, "part two\n")).toBe("part two\n");
      expect((await reader.read()).done).toBe(true);
    });

    it("streams a POST body in", async () => {
      const body = randomBytes(BODY_BYTES);
      const res = await fetch(portUrl(NODE_PORT, "/echo"), {
        method: "POST",
        body,
        headers: { "content-type": "application/octet-stream" },
      });
      expect(res.status).toBe(200);
      expect(await res.json()).toEqual({
        method: "POST",
        size: body.length,
        sha256: createHash("sha256").update(body).digest("hex"),
      });
      const put = await fetch(portUrl(NODE_PORT, "/echo"), {
        method: "PUT",
        body: "{}",
        headers: { "content-type": "application/json" },
      });
      expect(await put.json()).toMatchObject({ method: "PUT", size: 2 });
    });

    it("relays a WebSocket to a server inside", async () => {
      const ws = new WebSocket(`${ts.wsUrl}/sandboxes/${id}/ports/${NODE_PORT}/ws`);
      const echoed = await new Promise<string[]>((resolve, reject) => {
        const got: string[] = [];
        ws.on("open", () => ws.send("ping"));
        ws.on("message", (data) => {
          got.push(data.toString());
          if (got.length === 1) ws.send("x".repeat(3000));
          else ws.close();
        });
        ws.on("close", () => resolve(got));
        ws.on("error", reject);
      });
      expect(echoed).toEqual(["ping", "x".repeat(3000)]);
    });

    it("serves the host-name form {port}-{id}.<BOTHY_PREVIEW_DOMAIN>, WebSockets too", async () => {
      const host = `${NODE_PORT}-${id}.${PREVIEW_DOMAIN}`;
      const hello = await getWithHost(ts.url, host, "/hello?a=b");
      expect(hello).toMatchObject({ status: 200, body: "hello from inside\n" });
      expect(hello.headers["x-seen-path"]).toBe("/hello?a=b");
      // At the root of its own origin, the app needs no prefix.
      expect(hello.headers["x-seen-prefix"]).toBe("(none)");
      const ws = new WebSocket(`${ts.wsUrl}/ws`, { headers: { host } });
      const echoed = await new Promise<string>((resolve, reject) => {
        ws.on("open", () => ws.send("over the host name"));
        ws.on("message", (data) => {
          resolve(data.toString());
          ws.close();
        });
        ws.on("error", reject);
      });
      expect(echoed).toBe("over the host name");
      const notListening = await getWithHost(ts.url, `9-${id}.${PREVIEW_DOMAIN}`, "/");
      expect(notListening.status).toBe(502);
      // Any other host name is the API as usual.
      expect((await getWithHost(ts.url, `8000-sbx_nope.${PREVIEW_DOMAIN}`, "/healthz")).status).toBe(200);
    });

    it("opens a port link in a browser without a key: the token becomes a cookie for that port only", async () => {
      const link = await (await Sandbox.connect(id, { baseUrl: ts.url })).ports.link(NODE_PORT, { ttlS: 600 });
      const base = `/sandboxes/${id}/ports/${NODE_PORT}`;
      expect(link.url).toMatch(new RegExp(`^${ts.url}${base}/\\?token=[\\w-]+\\.[\\w-]+$`));
      expect(link.preview_url).toMatch(new RegExp(`^http://${NODE_PORT}-${id}\\.${PREVIEW_DOMAIN}:\\d+/\\?token=`));
      const token = new URL(link.url).searchParams.get("token")!;
      const anonymous = (url: string, headers: Record<string, string> = {}): Promise<Response> =>
        fetch(url, { redirect: "manual", headers: { ...ANONYMOUS, ...headers } });

      // Without a key or token: 401 as before.
      expect((await anonymous(portUrl(NODE_PORT, "/hello"))).status).toBe(401);
      // The first GET trades the token for a cookie scoped to the port and comes back without it.
      const landing = await anonymous(`${ts.url}${base}/hello?a=1&token=${token}`);
      expect(landing.status).toBe(303);
      expect(landing.headers.get("location")).toBe(`${base}/hello?a=1`);
      const cookie = landing.headers.get("set-cookie")!;
      expect(cookie).toContain(`bothy_link=${token}`);
      expect(cookie).toContain(`Path=${base}`);
      expect(cookie).toMatch(/HttpOnly/);
      expect(cookie).toMatch(/SameSite=Lax/);
      // A follow-up request (a relative link of the app) goes by the cookie; the app sees neither.
      const jar = `theme=dark; bothy_link=${token}`;
      const hello = await anonymous(`${ts.url}${base}/hello?a=1`, { cookie: jar });
      expect(hello.status).toBe(200);
      expect(await hello.text()).toBe("hello from inside\n");
      expect(hello.headers.get("x-seen-path")).toBe("/hello?a=1");
      expect(hello.headers.get("x-seen-cookie")).toBe("theme=dark");
      // Another method with ?token= is passed on without the token.
      const post = await fetch(`${ts.url}${base}/hello?token=${token}&b=2`, {
        method: "POST",
        headers: ANONYMOUS,
      });
      expect(post.status).toBe(200);
      expect(post.headers.get("x-seen-path")).toBe("/hello?b=2");
      // WebSockets by the cookie too.
      const ws = new WebSocket(`${ts.wsUrl}${base}/ws`, { headers: { ...ANONYMOUS, cookie: jar } });
      const echoed = await new Promise<string>((resolve, reject) => {
        ws.on("open", () => ws.send("by the cookie"));
        ws.on("message", (data) => {
          resolve(data.toString());
          ws.close();
        });
        ws.on("error", reject);
      });
      expect(echoed).toBe("by the cookie");
      // The preview host form sets its cookie for the whole (port's own) host.
      const preview = await getWithHost(ts.url, `${NODE_PORT}-${id}.${PREVIEW_DOMAIN}`, `/?token=${token}`, ANONYMOUS);
      expect(preview.status).toBe(303);
      expect(preview.headers["location"]).toBe("/");
      expect(String(preview.headers["set-cookie"])).toContain("Path=/;");

      // Nothing else: another port, another sandbox, other API routes, an expired or tampered token.
      const other = await otherSandbox();
      expect((await anonymous(portUrl(LOOPBACK_PORT, `/www/index.txt?token=${token}`))).status).toBe(401);
      expect((await anonymous(`${ts.url}/sandboxes/${other}/ports/${NODE_PORT}/hello?token=${token}`)).status).toBe(
        401,
      );
      expect((await anonymous(`${ts.url}/sandboxes/${id}/ports?token=${token}`)).status).toBe(401);
      expect((await anonymous(`${ts.url}/sandboxes/${id}/desktop?token=${token}`)).status).toBe(401);
      const sign = await linkSigner(ts);
      const expired = sign({ sid: id, what: `port:${NODE_PORT}`, exp: Math.floor(Date.now() / 1000) - 5 });
      expect((await anonymous(`${ts.url}${base}/hello?token=${expired}`)).status).toBe(401);
      const [body, sig] = token.split(".");
      const payload = JSON.parse(Buffer.from(body!, "base64url").toString()) as Record<string, unknown>;
      const widened = Buffer.from(JSON.stringify({ ...payload, what: `port:${LOOPBACK_PORT}` })).toString("base64url");
      expect((await anonymous(portUrl(LOOPBACK_PORT, `/www/index.txt?token=${widened}.${sig}`))).status).toBe(401);
      expect((await anonymous(`${ts.url}${base}/hello`, { cookie: `bothy_link=${token.slice(0, -2)}xx` })).status).toBe(
        401,
      );
      // A key of another tenant cannot mint one for this sandbox: the sandbox is unknown to it.
      expect((await api(ts.url, "POST", "/tenants", { tenant: "elsewhere" })).status).toBe(201);
      const mint = await api(ts.url, "POST", "/keys", { tenant: "elsewhere", scopes: ["sandboxes:write"] });
      const stranger = await fetch(`${ts.url}/sandboxes/${id}/port-links/${NODE_PORT}`, {
        method: "POST",
        headers: { authorization: `Bearer ${String(mint.json["key"])}`, "content-type": "application/json" },
        body: "{}",
      });
      expect(stranger.status).toBe(404);
      // The CLI prints one too.
      const printed = await new Promise<string>((resolve, reject) =>
        execFile(
          process.execPath,
          [BOTHY, "port", id, String(NODE_PORT), "--link", "--ttl", "60"],
          { env: { ...process.env, BOTHY_URL: ts.url } },
          (err, stdout) => (err ? reject(err) : resolve(stdout)),
        ),
      );
      expect(printed).toMatch(new RegExp(`^${ts.url}${base}/\\?token=[\\w-]+\\.[\\w-]+\\n$`));
      expect((await anonymous(printed.trim())).status).toBe(303);
      // The token never reaches the server's log, any other file of its home, or its events.
      const signature = token.split(".")[1]!;
      expect(readFileSync(ts.logPath, "utf8")).not.toContain(signature);
      expect((await homeFilesHolding(ts.home, [signature], SANDBOX_TREES)).hits).toEqual([]);
      expect(JSON.stringify(ts.events)).not.toContain(signature);
    });

    it("answers 502 port_not_listening for a port nobody listens on, 400 for a port that is no port", async () => {
      const res = await fetch(portUrl(9, "/"));
      expect(res.status).toBe(502);
      expect(res.headers.get("content-type")).toContain("application/problem+json");
      const problem = (await res.json()) as { code: string; detail: string };
      expect(problem.code).toBe("port_not_listening");
      expect(problem.detail).toContain(`/sandboxes/${id}/ports`);
      const bad = await api(ts.url, "GET", `/sandboxes/${id}/ports/99999/`);
      expect(bad.status).toBe(400);
      expect(bad.json["code"]).toBe("invalid_request");
    });

    it("resets the connection inside when the client goes away", async () => {
      const controller = new AbortController();
      const res = await fetch(portUrl(NODE_PORT, "/stream"), { signal: controller.signal });
      await readUntil((res.body as ReadableStream<Uint8Array>).getReader(), "part one\n");
      expect(await establishedTo(ts, id, NODE_PORT)).toBe(1);
      controller.abort();
      await waitNoConnections(ts, id, NODE_PORT);
    });

    it.skipIf(driver.name !== "gvisor")("downloads 20 MB paced by its client: nothing buffers the body", async () => {
      const TOTAL = 20_000_000;
      const rssBefore = process.memoryUsage().rss;
      let peak = rssBefore;
      const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 20);
      let response: IncomingMessage | undefined;
      let received = 0;
      const done = new Promise<void>((resolve, reject) => {
        httpGet(portUrl(NODE_PORT, `/bytes?n=${TOTAL}`), (res) => {
          response = res;
          // The client stops reading after its first bytes.
          res.once("data", (c: Buffer) => {
            received += c.length;
            res.pause();
            res.on("data", (more: Buffer) => (received += more.length));
          });
          res.on("end", resolve);
          res.on("error", reject);
        }).on("error", reject);
      });
      // While it does not read, the server inside is held back once the windows and socket
      // buffers on the way are full: its progress settles below the whole body. A proxy that
      // buffered would let it write all 20 MB.
      let progress = -1;
      for (let settled = 0; settled < 3;) {
        await new Promise((r) => setTimeout(r, 300));
        const now = Number(await (await fetch(portUrl(NODE_PORT, "/progress"))).text());
        settled = now === progress && now > 0 ? settled + 1 : 0;
        progress = now;
      }
      expect(progress).toBeLessThan(TOTAL);
      (response as IncomingMessage).resume();
      await done;
      clearInterval(sampler);
      expect(received).toBe(TOTAL);
      const growthMb = (peak - rssBefore) / 1024 / 1024;
      console.info(
        `${driver.name}: 20 MB through the port proxy: held at ${(progress / 1e6).toFixed(1)} MB written while paused; test process RSS +${growthMb.toFixed(1)} MB`,
      );
      expect(growthMb).toBeLessThan(60); // server and client together; mostly garbage not yet collected
    });

    it.skipIf(driver.name !== "gvisor")("downloads 100 MB through the proxy intact", async () => {
      const TOTAL = 100_000_000;
      const res = await fetch(portUrl(NODE_PORT, `/bytes?n=${TOTAL}`));
      expect(res.status).toBe(200);
      expect(res.headers.get("content-length")).toBe(String(TOTAL));
      const hash = createHash("sha256");
      let size = 0;
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        hash.update(chunk);
        size += chunk.length;
      }
      expect(size).toBe(TOTAL);
      expect(hash.digest("hex")).toBe(createHash("sha256").update(Buffer.alloc(TOTAL, 97)).digest("hex"));
      await waitNoConnections(ts, id, NODE_PORT);
    });

    it("forwards a local loopback port to a port inside as raw TCP (SDK ports.forward)", async () => {
      const sandbox = await Sandbox.connect(id, { baseUrl: ts.url });
      await expect(sandbox.ports.forward(NODE_PORT, { host: "0.0.0.0" })).rejects.toThrow(/loopback/);
      const forward = await sandbox.ports.forward(NODE_PORT);
      try {
        expect(forward.host).toBe("127.0.0.1");
        // HTTP written by hand on the raw connection: nothing but bytes crosses the tunnel.
        const answer = await new Promise<string>((resolve, reject) => {
          const socket = connect(forward.localPort, "127.0.0.1", () =>
            socket.write("GET /hello HTTP/1.1\r\nHost: anything\r\nConnection: close\r\n\r\n"),
          );
          let got = "";
          socket.on("data", (c: Buffer) => (got += c.toString()));
          socket.on("end", () => resolve(got));
          socket.on("error", reject);
        });
        expect(answer).toMatch(/^HTTP\/1\.1 200 OK/);
        expect(answer).toContain("hello from inside");
        const body = randomBytes(BODY_BYTES);
        const echoed = await fetch(`http://127.0.0.1:${forward.localPort}/echo`, { method: "POST", body });
        expect(await echoed.json()).toMatchObject({ size: body.length });
      } finally {
        await forward.close();
      }
      await waitNoConnections(ts, id, NODE_PORT);
      const nobody = new WebSocket(`${ts.wsUrl}/sandboxes/${id}/tunnel/9`);
      const closed = await new Promise<[number, string]>((resolve, reject) => {
        nobody.on("close", (code, reason) => resolve([code, reason.toString()]));
        nobody.on("error", reject);
      });
      expect(closed).toEqual([1011, "port_not_listening"]);
      const plain = await api(ts.url, "GET", `/sandboxes/${id}/tunnel/${NODE_PORT}`);
      expect(plain.status).toBe(426);
      expect(plain.json["code"]).toBe("upgrade_required");
    });

    it("bothy port ID PORT --forward LOCAL serves the port locally until interrupted", async () => {
      const child = spawn(process.execPath, [BOTHY, "port", id, String(NODE_PORT), "--forward", "0"], {
        env: { ...process.env, BOTHY_URL: ts.url },
        stdio: ["ignore", "pipe", "pipe"],
      });
      try {
        const line = await new Promise<string>((resolve, reject) => {
          let out = "";
          child.stdout.on("data", (c: Buffer) => {
            out += c.toString();
            if (out.includes("\n")) resolve(out);
          });
          child.once("exit", (code) => reject(new Error(`bothy port exited ${code}: ${out}`)));
        });
        const local = /^forwarding 127\.0\.0\.1:(\d+) -> port 8000 in sbx_/.exec(line)?.[1];
        expect(local, line).toBeDefined();
        const hello = await fetch(`http://127.0.0.1:${local}/hello`);
        expect(await hello.text()).toBe("hello from inside\n");
      } finally {
        const exited = new Promise<number | null>((resolve) => child.once("exit", resolve));
        child.kill("SIGINT");
        expect(await exited).toBe(0);
      }
    });

    it("ends an open proxied stream when its sandbox is deleted", async () => {
      const other = await otherSandbox();
      const otherUrl = `${ts.url}/sandboxes/${other}/ports/${NODE_PORT}`;
      await startPortServer(ts, other);
      const res = await fetch(`${otherUrl}/stream`);
      const reader = (res.body as ReadableStream<Uint8Array>).getReader();
      await readUntil(reader, "part one\n");
      expect((await api(ts.url, "DELETE", `/sandboxes/${other}`)).status).toBe(200);
      await expect(readUntil(reader, "part two\n")).rejects.toThrow();
      const after = await api(ts.url, "GET", `/sandboxes/${other}/ports`);
      expect(after.json["code"]).toBe("sandbox_not_running");
    });
  });
}
