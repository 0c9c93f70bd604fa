/**
 * The desktop over HTTP: start it, screenshots, mouse and keyboard; the live view (noVNC served
 * by bothy, its WebSocket relayed to the sandbox's VNC server over the guest channel: bothy's own
 * websockify); Chromium's DevTools endpoint for host-side Playwright (`connectOverCDP`).
 */
import { readFile } from "node:fs/promises";
import { request as httpRequest } from "node:http";
import { createRequire } from "node:module";
import type { Socket } from "node:net";
import { dirname, join, normalize, sep } from "node:path";
import type { FastifyInstance, FastifyRequest } from "fastify";
import {
  BothyError,
  desktopAction,
  desktopActionResult,
  desktopInfo,
  desktopStartRequest,
  linkRequest,
  linkResponse,
  SANDBOX_ID_RE,
} from "@bothy/protocol";
import { z } from "zod";
import { principalOf } from "../auth/auth-hooks.ts";
import type { LinkTokens } from "../auth/link-tokens.ts";
import { hasScope } from "../auth/scopes.ts";
import type { TcpStream } from "../agent/tcp-stream.ts";
import type { DesktopService } from "../desktop/desktop-service.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import { parseInput } from "./parse-input.ts";
import type { RelayMeter } from "./relay-meter.ts";
import { relayTcp } from "./tcp-relay.ts";
import { viewOnlyRfb } from "./rfb-view-only.ts";
import { empty, json, media } from "./route-schema.ts";

const tags = ["desktop"];
const startDoc = {
  tags,
  summary:
    "Start the desktop (Xvfb, openbox, x11vnc, Chromium) if it is not running; template desktop (409 desktop_not_available otherwise)",
  body: desktopStartRequest,
  response: { 200: json(desktopInfo, "The running desktop") },
};
const screenshotDoc = {
  tags,
  summary: "The screen as a PNG (X-Screen-Width/Height); coordinates of actions are its pixels. Starts the desktop",
  response: { 200: media("image/png", "The screen") },
};
const actionsDoc = {
  tags,
  summary: "Mouse and keyboard: move, click, type, key, scroll (xdotool inside the sandbox). Starts the desktop",
  body: desktopAction,
  response: { 200: json(desktopActionResult, "Done") },
};
const viewDoc = {
  tags,
  summary:
    "The live view: a noVNC page (view only; ?control=1 passes mouse and keyboard on with sandboxes:write); ?token= from a desktop link instead of an API key",
  querystring: z.object({ control: z.enum(["1"]).optional(), token: z.string().optional() }),
  response: { 200: media("text/html", "An HTML page") },
};
const linkDoc = {
  tags,
  summary:
    "A signed link to the live view that opens without an API key until it expires (ttl_s, default 3600, max 86400); view only unless control (which needs sandboxes:write)",
  body: linkRequest,
  response: { 200: json(linkResponse, "The link") },
};
const vncDoc = {
  tags,
  summary:
    "WebSocket: the desktop's VNC (RFB) stream in binary messages, relayed to x11vnc inside (what noVNC connects to); input is dropped without sandboxes:write; ?token= from a desktop link instead of an API key",
  response: { 101: empty("Switching to WebSocket") },
};
const cdpDoc = {
  tags,
  summary:
    "Chromium's DevTools /json/version and /json/list, WebSocket URLs rewritten to the port proxy: give /sandboxes/{id}/desktop/cdp to Playwright's connectOverCDP",
  response: { 200: media("application/json", "DevTools JSON") },
};
const novncDoc = {
  tags,
  summary: "noVNC's own files (core/, vendor/), for the live view",
  response: { 200: media("text/javascript", "JavaScript") },
};

type Params = { Params: { id: string } };

const CDP_JSON_LIMIT = 1024 * 1024;

function novncRoot(): string {
  // The package exports core/rfb.js only; its folder holds the rest of noVNC (core/, vendor/).
  return dirname(dirname(createRequire(import.meta.url).resolve("@novnc/novnc")));
}

/** The absolute URL of a path on this server, as the client reached it. */
export function absoluteUrl(request: FastifyRequest, path: string, host = request.headers.host ?? "127.0.0.1"): string {
  return `${request.protocol}://${host}${path}`;
}

/**
 * The page a person opens to watch (and, with ?control=1, use) the sandbox's screen. A link's
 * token goes on to the WebSocket; the relay itself drops input when the principal may only read.
 * `embedded`: a token minted for this page (E2B's stream URL), written into it instead.
 */
export function viewerPage(id: string, control: boolean, token: string | undefined, embedded?: string): string {
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>bothy desktop ${id}</title>
<style>html,body{margin:0;height:100%;background:#202124;color:#ddd;font:13px sans-serif}
#screen{position:absolute;inset:0}#status{position:absolute;right:8px;bottom:6px;opacity:.7}</style>
</head>
<body data-state="connecting">
<div id="screen"></div><div id="status">connecting</div>
<script type="module">
import RFB from "/desktop/novnc/core/rfb.js";
const scheme = location.protocol === "https:" ? "wss:" : "ws:";
const token = ${embedded === undefined ? 'new URLSearchParams(location.search).get("token")' : JSON.stringify(embedded)};
const url = scheme + "//" + location.host + "/sandboxes/${id}/desktop/vnc" + (token ? "?token=" + encodeURIComponent(token) : "");
${token === undefined ? "" : 'history.replaceState(null, "", location.pathname + (location.search.includes("control=1") ? "?control=1" : ""));'}
${embedded === undefined ? "" : 'history.replaceState(null, "", location.pathname);'}
const status = document.getElementById("status");
const show = (state, text) => { document.body.dataset.state = state; status.textContent = text; };
// A dropped or refused connection (the desktop still starting, the sandbox waking) is retried, as a person would.
let wait = 500;
function connect() {
  const rfb = new RFB(document.getElementById("screen"), url, { shared: true });
  rfb.viewOnly = ${control ? "false" : "true"};
  rfb.scaleViewport = true;
  rfb.addEventListener("connect", () => { wait = 500; show("connected", "live"); });
  rfb.addEventListener("disconnect", () => {
    show("reconnecting", "disconnected: reconnecting");
    setTimeout(connect, wait);
    wait = Math.min(wait * 2, 5000);
  });
}
connect();
</script>
</body>
</html>
`;
}

/** One GET to a port inside the sandbox, its body read whole (bounded). */
function getInside(tunnel: TcpStream, port: number, path: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        method: "GET",
        path,
        headers: { host: `localhost:${port}` },
        createConnection: () => tunnel as unknown as Socket,
      },
      (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => {
          body += chunk;
          if (body.length > CDP_JSON_LIMIT) req.destroy(new Error("answer too large"));
        });
        res.on("end", () => resolve({ status: res.statusCode ?? 502, body }));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.on("close", () => tunnel.destroy());
    req.end();
  });
}

/**
 * Chromium's /json answers name WebSocket URLs on the sandbox's loopback; these are rewritten to
 * the server's port proxy, which reaches that port with the `localhost` Host Chromium requires.
 */
function rewriteCdpUrls(value: unknown, wsBase: string): unknown {
  if (Array.isArray(value)) return value.map((v) => rewriteCdpUrls(v, wsBase));
  if (typeof value !== "object" || value === null) return value;
  const out: Record<string, unknown> = {};
  for (const [key, v] of Object.entries(value as Record<string, unknown>)) {
    if (key === "devtoolsFrontendUrl") continue; // a page on the sandbox's loopback: of no use outside
    out[key] = key === "webSocketDebuggerUrl" && typeof v === "string" ? v.replace(/^ws:\/\/[^/]+/, wsBase) : v;
  }
  return out;
}

function sandboxId(request: FastifyRequest<Params>): string {
  const { id } = request.params;
  if (!SANDBOX_ID_RE.test(id)) throw new BothyError("invalid_sandbox_id", `"${id.slice(0, 64)}" is not a sandbox id.`);
  return id;
}

export async function desktopRoutes(
  app: FastifyInstance,
  manager: SandboxManager,
  desktop: DesktopService,
  links: LinkTokens,
  relays: RelayMeter,
): Promise<void> {
  app.post<Params>("/sandboxes/:id/desktop/start", { schema: startDoc }, async (request) => {
    const size = parseInput(desktopStartRequest, request.body, "POST /desktop/start");
    await manager.info(request.params.id);
    return desktop.start(request.params.id, size, true);
  });

  app.get<Params>("/sandboxes/:id/desktop/screenshot", { schema: screenshotDoc }, async (request, reply) => {
    const shot = await desktop.screenshot(request.params.id);
    return reply
      .type("image/png")
      .header("cache-control", "no-store")
      .header("x-screen-width", String(shot.width))
      .header("x-screen-height", String(shot.height))
      .send(shot.png);
  });

  app.post<Params>("/sandboxes/:id/desktop/actions", { schema: actionsDoc }, async (request) =>
    desktop.act(request.params.id, request.body),
  );

  app.get<Params & { Querystring: { control?: string; token?: string } }>(
    "/sandboxes/:id/desktop",
    { schema: viewDoc },
    async (request, reply) => {
      const id = sandboxId(request);
      await manager.info(id);
      const control = request.query.control === "1" && hasScope(principalOf(request).scopes, "sandboxes:write");
      return reply
        .type("text/html; charset=utf-8")
        .header("cache-control", "no-store")
        .header("referrer-policy", "no-referrer")
        .send(viewerPage(id, control, request.query.token));
    },
  );

  app.post<Params>("/sandboxes/:id/desktop/link", { schema: linkDoc }, async (request) => {
    const id = sandboxId(request);
    const body = parseInput(linkRequest, request.body ?? {}, "POST /desktop/link");
    if (body.control === true && !hasScope(principalOf(request).scopes, "sandboxes:write"))
      throw new BothyError(
        "scope_missing",
        "A desktop link with control needs a key with the scope sandboxes:write; ask for a view-only link (control false) or use such a key.",
        { details: { scope: "sandboxes:write" } },
      );
    await manager.info(id);
    const exp = Math.floor(Date.now() / 1000) + body.ttl_s;
    const token = links.sign(
      { sid: id, what: "desktop", ...(body.control ? { control: true } : {}), exp },
      principalOf(request),
    );
    const query = `${body.control ? "control=1&" : ""}token=${token}`;
    return {
      url: absoluteUrl(request, `/sandboxes/${id}/desktop?${query}`),
      expires_at: new Date(exp * 1000).toISOString(),
    };
  });

  app.get<{ Params: { "*": string } }>("/desktop/novnc/*", { schema: novncDoc }, async (request, reply) => {
    const root = novncRoot();
    const rel = normalize(request.params["*"]);
    const file = join(root, rel);
    if (!/^(core|vendor)\//.test(rel) || !rel.endsWith(".js") || !file.startsWith(root + sep))
      throw new BothyError("route_not_found", "No such file of noVNC.");
    const body = await readFile(file).catch((err: unknown) => {
      throw new BothyError("route_not_found", "No such file of noVNC.", { cause: err });
    });
    return reply.type("text/javascript; charset=utf-8").header("cache-control", "public, max-age=3600").send(body);
  });

  // websockify's job, done here: WebSocket binary messages <-> the VNC server's TCP stream inside.
  app.route<Params>({
    method: "GET",
    url: "/sandboxes/:id/desktop/vnc",
    schema: vncDoc,
    preValidation: async (request) => {
      await manager.info(request.params.id);
    },
    handler: async () => {
      throw new BothyError(
        "upgrade_required",
        "This endpoint is the desktop's VNC stream over a WebSocket; open /sandboxes/ID/desktop in a browser to watch.",
      );
    },
    // A principal that may only read (a view-only link, a sandboxes:read key) gets the screen
    // but none of its input reaches the VNC server: the relay drops it.
    wsHandler: (socket, request) =>
      relayTcp(
        socket,
        request.log,
        request.params.id,
        relays,
        async () => {
          const info = await desktop.start(request.params.id);
          return (await manager.agent(request.params.id)).openTcp(info.vnc_port);
        },
        hasScope(principalOf(request).scopes, "sandboxes:write") ? undefined : viewOnlyRfb(),
      ),
  });

  const cdpJson = async (request: FastifyRequest<Params & { Params: { "*": string } }>): Promise<unknown> => {
    const id = request.params.id;
    const rest = request.params["*"].replace(/\/$/, "");
    if (!["json", "json/list", "json/version"].includes(rest))
      throw new BothyError(
        "route_not_found",
        `The DevTools relay answers /json/version and /json/list; the WebSocket URLs they give go through /sandboxes/${id}/ports/PORT/.`,
      );
    const info = await desktop.start(id);
    const tunnel = await (await manager.agent(id)).openTcp(info.cdp_port);
    const answer = await getInside(tunnel, info.cdp_port, `/${rest}`);
    let parsed: unknown;
    try {
      parsed = JSON.parse(answer.body);
    } catch (err) {
      throw new BothyError("desktop_failed", `Chromium's DevTools answered ${answer.status} without JSON.`, {
        cause: err,
      });
    }
    const wsBase = `ws://${request.headers.host ?? "127.0.0.1"}/sandboxes/${id}/ports/${info.cdp_port}`;
    return rewriteCdpUrls(parsed, wsBase);
  };
  app.get("/sandboxes/:id/desktop/cdp/*", { schema: cdpDoc }, cdpJson);
}
