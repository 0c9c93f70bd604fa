import { request as httpRequest } from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Sandbox } from "@e2b/desktop";
import { PNG } from "pngjs";
import WebSocket from "ws";
import { ANONYMOUS } from "../../../test/auth.ts";
import { api } from "./helpers/client.ts";
import { driverTitle, testDriver } from "./helpers/drivers.ts";
import { homeFilesHolding, noLeaks, SANDBOX_TREES } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

const PREVIEW_DOMAIN = "desktop-preview.test";
const WIDTH = 1024;
const HEIGHT = 768;
const gvisor = testDriver("gvisor");

/**
 * A GET to the server by a host name that does not resolve (the Host header names it), as a
 * browser sends it: with no API key.
 */
function getByHost(serverUrl: string, url: string): Promise<{ status: number; type: string; body: string }> {
  const target = new URL(url);
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      `${serverUrl}${target.pathname}${target.search}`,
      { headers: { ...ANONYMOUS, host: target.host } },
      (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (d: string) => (body += d));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, type: String(res.headers["content-type"]), body }));
      },
    );
    req.on("error", reject);
    req.end();
  });
}

/** Polls `check` until it holds, for at most `seconds` (the screen and the browser move on their own time). */
async function eventually<T>(what: string, check: () => Promise<T | undefined>, seconds = 60): Promise<T> {
  const deadline = Date.now() + seconds * 1000;
  let last: unknown;
  for (;;) {
    try {
      const value = await check();
      if (value !== undefined) return value;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline)
      throw new Error(`${what}: never happened${last ? ` (last error: ${String(last)})` : ""}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** The page the sandbox's own web server serves: a click and the typed text show in its title. */
const PAGE = `<!doctype html><html><head><title>ready</title></head>
<body style="margin:0">
<input id="t" style="position:fixed;left:0;top:0;width:100%;height:100%;font-size:40px">
<script>
const t = document.getElementById("t");
t.addEventListener("mousedown", () => { document.title = "clicked"; });
t.addEventListener("keydown", (e) => { if (e.key === "Enter") document.title = "typed:" + t.value; });
</script></body></html>`;

/**
 * The real `@e2b/desktop` SDK (2.4.0) against a real bothy (gVisor, template `desktop`),
 * configured only as an E2B user would: E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY. One
 * sandbox for the file. The driver does not matter here (the mapping is the server's), so QEMU,
 * where Chromium is emulated and slow, is left out.
 */
describe.skipIf(gvisor.missing !== undefined)(driverTitle(gvisor, "E2B desktop SDK (@e2b/desktop 2.4.0)"), () => {
  let ts: TestServer;
  let desktop: Sandbox;
  const saved: Record<string, string | undefined> = {};
  const E2B_ENV = ["E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DOMAIN", "E2B_DEBUG"] as const;

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor", BOTHY_PREVIEW_DOMAIN: PREVIEW_DOMAIN });
    for (const name of E2B_ENV) saved[name] = process.env[name];
    delete process.env["E2B_DOMAIN"];
    delete process.env["E2B_DEBUG"];
    process.env["E2B_API_URL"] = `${ts.url}/e2b`;
    process.env["E2B_SANDBOX_URL"] = `${ts.url}/e2b/envd`;
    process.env["E2B_API_KEY"] = ts.apiKey;
    desktop = await Sandbox.create({ resolution: [WIDTH, HEIGHT], timeoutMs: 900_000 });
  });

  afterAll(async () => {
    await desktop?.kill().catch(() => undefined);
    for (const name of E2B_ENV) {
      if (saved[name] === undefined) delete process.env[name];
      else process.env[name] = saved[name];
    }
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  it("creates the sandbox from bothy's desktop template; a screenshot is a PNG of the screen's size", async () => {
    expect(desktop.sandboxId).toMatch(/^sbx_/);
    const info = await desktop.getInfo();
    expect(info.templateId).toBe("desktop");
    const shot = await desktop.screenshot();
    expect(Buffer.from(shot.subarray(0, 8)).toString("hex")).toBe("89504e470d0a1a0a");
    const image = PNG.sync.read(Buffer.from(shot));
    expect([image.width, image.height]).toEqual([WIDTH, HEIGHT]);
    // The SDK's own commands see the same screen on its display (:0): xrandr runs as sent.
    expect(await desktop.getScreenSize()).toEqual({ width: WIDTH, height: HEIGHT });
    // scrot's file was read and removed by the SDK; nothing of it is left behind.
    const left = await desktop.commands.run("ls /tmp | grep -c '^screenshot-' || true");
    expect(left.stdout.trim()).toBe("0");
  });

  it("moves the mouse: xdotool getmouselocation shows where", async () => {
    await desktop.moveMouse(123, 234);
    expect(await desktop.getCursorPosition()).toEqual({ x: 123, y: 234 });
    const raw = await desktop.commands.run("xdotool getmouselocation");
    expect(raw.stdout).toMatch(/^x:123 y:234 /);
  });

  it("opens a page served inside the sandbox; a click, typing and Enter reach it", async () => {
    await desktop.files.write("/tmp/site/page.html", PAGE);
    await desktop.commands.run("cd /tmp/site && exec python3 -m http.server 8765 --bind 127.0.0.1", {
      background: true,
    });
    await eventually("the sandbox's web server", async () =>
      (
        await desktop.commands.run(
          "python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8765/page.html')\"",
        )
      ).exitCode === 0
        ? true
        : undefined,
    );
    await desktop.open("http://127.0.0.1:8765/page.html");
    const title = async (): Promise<string> => desktop.getWindowTitle(await desktop.getCurrentWindowId());
    await eventually("the page in Chromium", async () => ((await title()).startsWith("ready") ? true : undefined));

    await desktop.leftClick(WIDTH / 2, HEIGHT / 2);
    await eventually("the click", async () => ((await title()).startsWith("clicked") ? true : undefined));
    await desktop.write("hello bothy");
    await desktop.press("enter");
    await eventually("the typed text", async () =>
      (await title()).startsWith("typed:hello bothy") ? true : undefined,
    );
    // The screen shows it too: the screenshot differs from a blank screen in the input's area.
    const image = PNG.sync.read(Buffer.from(await desktop.screenshot()));
    expect(image.data.some((v, i) => i % 4 !== 3 && v < 128)).toBe(true);
  });

  it("refuses what bothy's desktop cannot do, each with a message saying what to do", async () => {
    await expect(desktop.launch("xterm")).rejects.toThrow(/gtk-launch.*open\(\)/);
    // A stream without a password would be open to anyone who knows the sandbox id.
    await expect(desktop.stream.start()).rejects.toThrow(/requireAuth: true/);
    await expect(desktop.open("javascript:alert(1)")).rejects.toThrow(/http\(s\) and file/);
  });

  it("stream.start({ requireAuth }) + getUrl: the URL serves bothy's noVNC viewer, relayed to the screen", async () => {
    await desktop.stream.start({ requireAuth: true });
    const url = desktop.stream.getUrl({ authKey: desktop.stream.getAuthKey() });
    const parsed = new URL(url);
    expect(parsed.host).toBe(`6080-${desktop.sandboxId}.${PREVIEW_DOMAIN}`);
    expect(parsed.pathname).toBe("/vnc.html");

    const page = await getByHost(ts.url, url);
    expect(page.status).toBe(200);
    expect(page.type).toContain("text/html");
    expect(page.body).toContain(`<title>bothy desktop ${desktop.sandboxId}</title>`);
    expect(page.body).toContain('import RFB from "/desktop/novnc/core/rfb.js"');
    // The page's own resources come from the same host.
    const rfb = await getByHost(ts.url, `http://${parsed.host}/desktop/novnc/core/rfb.js`);
    expect(rfb.status).toBe(200);
    expect(rfb.type).toContain("javascript");

    // The page's WebSocket, with the link it was given, greets as a VNC server does.
    const token = /const token = "([^"]+)"/.exec(page.body)?.[1];
    expect(token).toBeDefined();
    const ws = new WebSocket(
      `${ts.wsUrl}/sandboxes/${desktop.sandboxId}/desktop/vnc?token=${encodeURIComponent(token!)}`,
      { headers: { ...ANONYMOUS, host: parsed.host } },
    );
    try {
      const greeting = await new Promise<string>((resolve, reject) => {
        ws.once("message", (data: Buffer) => resolve(data.toString("latin1")));
        ws.once("error", reject);
      });
      expect(greeting).toMatch(/^RFB 003\.00\d\n/);
    } finally {
      ws.close();
    }
    // The SDK sees its stream running; a second start is its own error.
    await expect(desktop.stream.start({ requireAuth: true })).rejects.toThrow(/already running/);
  });

  it("keeps the stream's password in no file of the server's home, the ledger's process list included", async () => {
    const password = desktop.stream.getAuthKey();
    expect(password.length).toBeGreaterThanOrEqual(8);
    const { read, hits } = await homeFilesHolding(ts.home, [password], SANDBOX_TREES);
    expect(read.some((p) => p.includes("ledger"))).toBe(true);
    expect(hits).toEqual([]);
  });

  it("a holder of the stream URL without its password (or with a wrong one) gets no viewer", async () => {
    const url = new URL(desktop.stream.getUrl());
    expect(url.searchParams.has("password")).toBe(false);
    for (const password of [undefined, "A".repeat(16), desktop.stream.getAuthKey().slice(0, 15)]) {
      if (password === undefined) url.searchParams.delete("password");
      else url.searchParams.set("password", password);
      const page = await getByHost(ts.url, url.toString());
      expect(page.status).toBe(401);
      expect(page.body).toContain("requireAuth: true");
      expect(page.body).not.toContain("const token");
    }
    // The VNC WebSocket on the stream host needs a link like any other.
    const ws = new WebSocket(`${ts.wsUrl}/sandboxes/${desktop.sandboxId}/desktop/vnc`, {
      headers: { ...ANONYMOUS, host: url.host },
    });
    // A refused handshake also ends in an error event, which is not what this test checks.
    ws.on("error", () => undefined);
    const status = await new Promise<number>((resolve) => {
      ws.once("unexpected-response", (_req, res) => resolve(res.statusCode ?? 0));
      ws.once("open", () => resolve(101));
    });
    ws.terminate();
    expect(status).toBe(401);
  });

  it("a stream started under a key ends when that key is revoked", async () => {
    const made = await api(ts.url, "POST", "/keys", { scopes: ["sandboxes:read", "sandboxes:write"] });
    expect(made.status, JSON.stringify(made.json)).toBe(201);
    const { key, key_id } = made.json as { key: string; key_id: string };
    const theirs = await Sandbox.connect(desktop.sandboxId, { apiKey: key });
    await theirs.stream.stop();
    await theirs.stream.start({ requireAuth: true });
    const url = theirs.stream.getUrl({ authKey: theirs.stream.getAuthKey() });
    expect((await getByHost(ts.url, url)).status).toBe(200);
    expect((await api(ts.url, "DELETE", `/keys/${key_id}`)).status).toBe(200);
    const after = await getByHost(ts.url, url);
    expect(after.status).toBe(401);
    expect(after.body).not.toContain("const token");
    // The admin's own desktop object takes the stream back for the next test.
    await desktop.stream.stop();
    await desktop.stream.start({ requireAuth: true });
  });

  it("stream.stop() ends the URL: its host is no longer served as the viewer", async () => {
    const url = desktop.stream.getUrl({ authKey: desktop.stream.getAuthKey() });
    await desktop.stream.stop();
    const page = await getByHost(ts.url, url);
    expect(page.status).not.toBe(200);
    expect(page.body).not.toContain("bothy desktop");
    // bothy's own viewer still has its VNC server: stop() ended only the SDK's stream.
    const shot = PNG.sync.read(Buffer.from(await desktop.screenshot()));
    expect(shot.width).toBe(WIDTH);
  });
});
