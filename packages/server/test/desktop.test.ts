import { existsSync, readFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { chromium, type Browser } from "playwright-core";
import { PNG } from "pngjs";
import WebSocket from "ws";
import { Sandbox } from "@bothy/sdk";
import { ANONYMOUS } from "../../../test/auth.ts";
import { api, pollUntil } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { homeFilesHolding, noLeaks, SANDBOX_TREES } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

/**
 * The desktop template on gVisor: the agent's screen, mouse and keyboard (REST and SDK), Chromium
 * driven from the host over CDP, and the live view in the host's own headless Chromium. QEMU is
 * left out on purpose: on this machine it is emulated (TCG) and Chromium there is too slow for a
 * test (README, "The desktop").
 */
const HOST_CHROMIUM = "/usr/bin/chromium";
const HOST_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"];
const gvisor = testDrivers().find((d) => d.name === "gvisor");
const missing =
  gvisor?.missing ?? (existsSync(HOST_CHROMIUM) ? undefined : `${HOST_CHROMIUM} (apt-get install chromium)`);

type Rgb = [number, number, number];
const ORANGE: Rgb = [255, 128, 0];
const TEAL: Rgb = [0, 128, 128];

/** The pixel at (x, y) of a PNG. */
function pixel(png: Uint8Array, x: number, y: number): Rgb {
  const image = PNG.sync.read(Buffer.from(png));
  const at = (y * image.width + x) * 4;
  return [image.data[at]!, image.data[at + 1]!, image.data[at + 2]!];
}

/** Every pixel of a region of a PNG is within `tolerance` of `color`. */
function regionIs(png: Uint8Array, box: { x: number; y: number; w: number; h: number }, color: Rgb): boolean {
  const image = PNG.sync.read(Buffer.from(png));
  for (let y = box.y; y < box.y + box.h; y++)
    for (let x = box.x; x < box.x + box.w; x++) {
      const at = (y * image.width + x) * 4;
      if (color.some((c, i) => Math.abs(image.data[at + i]! - c) > 8)) return false;
    }
  return true;
}

/** Polls until `check` holds (the screen repaints on its own time); fails after `tries`. */
async function eventually(what: string, check: () => Promise<boolean>, tries = 200): Promise<void> {
  for (let i = 0; i < tries; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 150));
  }
  throw new Error(`${what}: never happened`);
}

const page = (color: Rgb, extra = ""): string =>
  `data:text/html,<body style="margin:0;background:rgb(${color.join(",")})">${extra}</body>`;

describe.skipIf(missing !== undefined)(driverTitle({ name: "gvisor", missing }, "desktop template"), () => {
  let ts: TestServer;
  let desk: Sandbox;
  let plain: Sandbox;
  let host: Browser | undefined;
  let cdp: Browser | undefined;

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor" });
    desk = await Sandbox.create({ baseUrl: ts.url, template: "desktop", vcpu: 2, memoryMib: 1024 });
    plain = await Sandbox.create({ baseUrl: ts.url, template: "seed", vcpu: 1, memoryMib: 256 });
  });
  afterAll(async () => {
    await cdp?.close().catch(() => undefined);
    await host?.close().catch(() => undefined);
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  it("refuses the desktop calls in a sandbox of another template with desktop_not_available", async () => {
    for (const [method, path, body] of [
      ["POST", "start", {}],
      ["GET", "screenshot", undefined],
      ["POST", "actions", { action: "move", x: 1, y: 1 }],
    ] as const) {
      const res = await api(ts.url, method, `/sandboxes/${plain.sandboxId}/desktop/${path}`, body);
      expect(res.status).toBe(409);
      expect(res.type).toContain("application/problem+json");
      expect(res.json).toMatchObject({ code: "desktop_not_available" });
      expect(String(res.json["detail"])).toContain('template "desktop"');
    }
  });

  it("starts on the first screenshot: a PNG of the screen, whose pixels are the action coordinates", async () => {
    const shot = await desk.desktop.screenshot();
    expect([shot.width, shot.height]).toEqual([1280, 800]);
    const image = PNG.sync.read(Buffer.from(shot.png));
    expect([image.width, image.height]).toEqual([1280, 800]);
    // Started already: an explicit start finds everything running.
    const info = await desk.desktop.start();
    expect(info).toMatchObject({ display: ":1", width: 1280, height: 800, started: [] });

    const off = await api(ts.url, "POST", `/sandboxes/${desk.sandboxId}/desktop/actions`, {
      action: "click",
      x: 1280,
      y: 10,
    });
    expect(off.status).toBe(400);
    expect(off.json).toMatchObject({ code: "invalid_request" });
    const bad = await api(ts.url, "POST", `/sandboxes/${desk.sandboxId}/desktop/actions`, {
      action: "key",
      keys: "ctrl+l; rm -rf /",
    });
    expect(bad.status).toBe(400);
    expect(bad.json).toMatchObject({ code: "invalid_request" });
  });

  it("drives the sandbox's Chromium with keyboard and mouse, seen in screenshots", async () => {
    await desk.desktop.key("ctrl+l");
    await desk.desktop.type(page(ORANGE));
    await desk.desktop.key("Return");
    const centre = { x: 600, y: 420, w: 80, h: 40 };
    await eventually("the page turns orange", async () =>
      regionIs((await desk.desktop.screenshot()).png, centre, ORANGE),
    );
  });

  it("lets host-side Playwright drive that Chromium over CDP through the server", async () => {
    const url = await desk.desktop.cdpUrl();
    expect(url).toBe(`${ts.url}/sandboxes/${desk.sandboxId}/desktop/cdp`);
    const version = await api(ts.url, "GET", `/sandboxes/${desk.sandboxId}/desktop/cdp/json/version`);
    expect(String(version.json["webSocketDebuggerUrl"])).toMatch(
      new RegExp(`^ws://127\\.0\\.0\\.1:\\d+/sandboxes/${desk.sandboxId}/ports/9222/devtools/browser/`),
    );
    cdp = await chromium.connectOverCDP(url);
    const tab = cdp
      .contexts()[0]
      ?.pages()
      .find((p) => p.url().startsWith("data:"));
    expect(tab).toBeDefined();
    // A page made for the mouse and keyboard checks: one field over the whole window, a tall body to scroll.
    await tab!.goto(
      page(
        TEAL,
        '<input id="f" style="position:fixed;left:0;top:0;width:100%;height:100px;font-size:40px">' +
          '<div style="height:5000px"></div>' +
          "<script>onmousemove = (e) => (window.seen = [e.screenX, e.screenY]);</script>",
      ),
    );
    expect(await tab!.evaluate<string>("document.body.style.background")).toBe("rgb(0, 128, 128)");
    await eventually("the page turns teal", async () =>
      regionIs((await desk.desktop.screenshot()).png, { x: 600, y: 420, w: 80, h: 40 }, TEAL),
    );

    // The field's top-left on the screen, from the window's position: a click there lands in it.
    const origin = await tab!.evaluate<number[]>("[screenX, screenY, outerHeight - innerHeight]");
    const fieldY = origin[1]! + origin[2]! + 50;
    await desk.desktop.click(400, fieldY);
    await desk.desktop.type("hello bothy");
    await eventually(
      "the field holds the text",
      async () => (await tab!.evaluate<string>("document.getElementById('f').value")) === "hello bothy",
    );
    await desk.desktop.move(700, 500);
    await eventually("the page saw the pointer at the screen coordinates", async () => {
      const seen = await tab!.evaluate<number[] | undefined>("window.seen");
      return seen?.[0] === 700 && seen[1] === 500;
    });
    await desk.desktop.scroll(700, 500, "down", 5);
    await eventually("the page scrolled", async () => (await tab!.evaluate<number>("scrollY")) > 0);
    expect(pixel((await desk.desktop.screenshot()).png, 640, 600)).toEqual(TEAL);
  });

  it("shows the screen live at a desktop link (noVNC) in the host's Chromium, with no API key", async () => {
    expect(desk.desktop.viewerUrl()).toBe(`${ts.url}/sandboxes/${desk.sandboxId}/desktop`);
    const link = await desk.desktop.viewerLink({ ttlS: 600 });
    expect(link.url).toMatch(new RegExp(`^${ts.url}/sandboxes/${desk.sandboxId}/desktop\\?token=[\\w-]+\\.[\\w-]+$`));
    const token = new URL(link.url).searchParams.get("token")!;
    // The token opens the live view and nothing else of the sandbox's API.
    const shot = await fetch(`${ts.url}/sandboxes/${desk.sandboxId}/desktop/screenshot?token=${token}`, {
      headers: ANONYMOUS,
    });
    expect(shot.status).toBe(401);
    expect(
      (await fetch(`${ts.url}/sandboxes/${plain.sandboxId}/desktop?token=${token}`, { headers: ANONYMOUS })).status,
    ).toBe(401);
    // The host's browser sends no key: the link alone lets it in (noVNC's files are public).
    host = await chromium.launch({ executablePath: HOST_CHROMIUM, args: HOST_FLAGS });
    const view = await host.newPage({ viewport: { width: 1280, height: 800 } });
    await view.goto(link.url);
    await view.waitForSelector("body[data-state=connected]", { timeout: 60_000 });
    // The token leaves the address bar once the page has it.
    expect(view.url()).toBe(`${ts.url}/sandboxes/${desk.sandboxId}/desktop`);
    // The sandbox shows teal (the previous test); it is scaled into the viewport, so look at the middle.
    const middle = { x: 560, y: 380, w: 160, h: 40 };
    await eventually("the viewer shows the teal page", async () => regionIs(await view.screenshot(), middle, TEAL));
    // Live: a change inside the sandbox reaches the viewer without a reload.
    const tab = cdp!.contexts()[0]!.pages()[0]!;
    await tab.evaluate("document.body.style.background = 'rgb(255, 128, 0)'");
    await eventually("the viewer shows the orange page", async () => regionIs(await view.screenshot(), middle, ORANGE));
    await view.close();

    // A link with control passes the person's mouse on to the sandbox.
    const control = await desk.desktop.viewerLink({ control: true, ttlS: 600 });
    expect(control.url).toContain("?control=1&token=");
    const hands = await host.newPage({ viewport: { width: 1280, height: 800 } });
    await hands.goto(control.url);
    await hands.waitForSelector("body[data-state=connected]", { timeout: 60_000 });
    const before = await tab.evaluate<number[] | undefined>("window.seen");
    let x = 300;
    await eventually("the sandbox's page saw the viewer's pointer", async () => {
      await hands.mouse.move((x += 7), 300);
      const seen = await tab.evaluate<number[] | undefined>("window.seen");
      return seen !== undefined && JSON.stringify(seen) !== JSON.stringify(before);
    });
    await hands.close();
    // A key with sandboxes:read only may watch but not ask for control.
    const made = await api(ts.url, "POST", "/keys", { scopes: ["sandboxes:read"] });
    const reader = await fetch(`${ts.url}/sandboxes/${desk.sandboxId}/desktop/link`, {
      method: "POST",
      headers: { authorization: `Bearer ${String(made.json["key"])}`, "content-type": "application/json" },
      body: JSON.stringify({ control: true }),
    });
    expect(reader.status).toBe(403);
    expect(((await reader.json()) as { code: string }).code).toBe("scope_missing");
    // Neither token reaches the server's log, any other file of its home, or its events.
    const log = readFileSync(ts.logPath, "utf8");
    expect(log).not.toContain(token.split(".")[1]);
    expect(log).not.toContain(new URL(control.url).searchParams.get("token")!.split(".")[1]);
    const signatures = [token, new URL(control.url).searchParams.get("token")!].map((t) => t.split(".")[1]!);
    expect((await homeFilesHolding(ts.home, signatures, SANDBOX_TREES)).hits).toEqual([]);
    for (const signature of signatures) expect(JSON.stringify(ts.events)).not.toContain(signature);
  });

  it("gives the agent the same screen as MCP tools: computer_screenshot as an image, the input tools", async () => {
    const client = new Client({ name: "bothy-desktop-test", version: "1.0.0" });
    await client.connect(new StreamableHTTPClientTransport(new URL(`${ts.url}/mcp`)));
    const made: string[] = [];
    try {
      for (const [id, template] of [
        ["desk-conv", "desktop"],
        ["plain-conv", "seed"],
      ] as const) {
        const res = await api(ts.url, "POST", "/conversations", { conversation_id: id, template, memory_mib: 1024 });
        expect(res.status).toBe(201);
        made.push(id);
      }
      const call = async (conv: string, name: string, args: Record<string, unknown> = {}): Promise<CallToolResult> =>
        (await client.callTool(
          { name, arguments: args, _meta: { "bothy/conversation_id": conv, "bothy/turn_id": "t1" } },
          undefined,
          { timeout: 120_000 },
        )) as CallToolResult;

      const refused = await call("plain-conv", "computer_screenshot");
      expect(refused.isError).toBe(true);
      expect(JSON.stringify(refused.content)).toContain("desktop_not_available");

      const first = await call("desk-conv", "computer_screenshot");
      expect(first.isError).toBeFalsy();
      const image = first.content.find((c) => c.type === "image");
      expect(image).toMatchObject({ type: "image", mimeType: "image/png" });
      expect(first._meta).toMatchObject({ width: 1280, height: 800 });

      for (const [name, args] of [
        ["computer_key", { keys: "ctrl+l" }],
        ["computer_type", { text: page(ORANGE) }],
        ["computer_key", { keys: "Return" }],
        ["computer_move", { x: 10, y: 10 }],
        ["computer_click", { x: 640, y: 600 }],
        ["computer_scroll", { x: 640, y: 600, direction: "down", amount: 2 }],
      ] as const) {
        const result = await call("desk-conv", name, args);
        expect(result.isError, `${name}: ${JSON.stringify(result.content)}`).toBeFalsy();
      }
      await eventually("the conversation's screen turns orange", async () => {
        const shot = await call("desk-conv", "computer_screenshot");
        const png = shot.content.find((c) => c.type === "image");
        return (
          png?.type === "image" && regionIs(Buffer.from(png.data, "base64"), { x: 600, y: 420, w: 80, h: 40 }, ORANGE)
        );
      });
    } finally {
      await client.close();
      for (const id of made) expect((await api(ts.url, "DELETE", `/conversations/${id}`)).status).toBe(200);
    }
  });

  it("drops a view-only viewer's clipboard message as it streams past: the host holds none of it", async () => {
    const link = await desk.desktop.viewerLink({ ttlS: 600 });
    const token = new URL(link.url).searchParams.get("token")!;
    const ws = new WebSocket(`${ts.wsUrl}/sandboxes/${desk.sandboxId}/desktop/vnc?token=${token}`, {
      headers: ANONYMOUS,
    });
    const received: Buffer[] = [];
    const bytesIn = (): number => received.reduce((n, b) => n + b.length, 0);
    ws.on("message", (data: Buffer) => received.push(data));
    await new Promise<void>((resolve, reject) => ws.once("open", resolve).once("error", reject));
    try {
      await pollUntil("x11vnc's version", () => bytesIn() >= 12);
      // The client's handshake (RFB 3.8, security None, shared), then a ClientCutText of 64 MiB.
      const CUT = 64 * 1024 * 1024;
      const cutHeader = Buffer.alloc(8);
      cutHeader.writeUInt8(6, 0);
      cutHeader.writeUInt32BE(CUT, 4);
      ws.send(Buffer.concat([Buffer.from("RFB 003.008\n"), Buffer.from([1, 1])]));
      // x11vnc's side up to the end of ServerInit: version, security types, result, init and name.
      const handshakeEnd = (): number | undefined => {
        const all = Buffer.concat(received);
        const types = all[12];
        if (types === undefined) return undefined;
        const init = 12 + 1 + types + 4;
        return all.length < init + 24 ? undefined : init + 24 + all.readUInt32BE(init + 20);
      };
      await pollUntil("x11vnc's ServerInit", () => {
        const end = handshakeEnd();
        return end !== undefined && bytesIn() >= end;
      });
      ws.send(cutHeader);
      const mib = Buffer.alloc(1024 * 1024, 0x61);
      for (let sent = 0; sent < CUT; sent += mib.length) ws.send(mib);
      // All of it left the client (the relay never paused it), and the host holds next to none.
      await pollUntil("the viewer's bytes to be taken", () => ws.bufferedAmount === 0, 120_000);
      const text = await (await fetch(`${ts.url}/metrics`)).text();
      const held = Number(/^bothy_relay_held_bytes (\d+)$/m.exec(text)?.[1]);
      expect(held).toBeLessThan(64 * 1024);
      // The stream is still in step: a picture request after it is answered.
      const before = bytesIn();
      ws.send(Buffer.from("03000000000000100010", "hex"));
      await pollUntil("a framebuffer update", () => bytesIn() > before, 60_000);
    } finally {
      ws.terminate();
    }
  });
});
