/**
 * The dashboard's files (packages/ui, built by `npm run build`) at `/ui/`. Hashed assets are
 * cached for a year; index.html never, so a new build is picked up at once. Every answer carries
 * a strict Content-Security-Policy: scripts only from this origin (none inline), connections only
 * to it (HTTP and WebSocket), and no page may frame the dashboard.
 */
import { readFile } from "node:fs/promises";
import { extname } from "node:path";
import { fileURLToPath } from "node:url";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { BothyError } from "@bothy/protocol";
import { hostName } from "../auth/host-check.ts";
import { empty, media } from "./route-schema.ts";

/** Where `npm run build` puts the dashboard. */
export const UI_DIST = fileURLToPath(new URL("../../../ui/dist/", import.meta.url));

/** Vite's asset names: a name, a hash and an extension, no path. */
const ASSET_RE = /^[A-Za-z0-9_.-]+\.(js|css|woff2|png|svg)$/;
const TYPES: Record<string, string> = {
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".woff2": "font/woff2",
  ".png": "image/png",
  ".svg": "image/svg+xml",
};

/**
 * The policy for a request to `host`. `connect-src` names the ws:/wss: form of this host too
 * (older browsers do not count it as 'self'). Styles allow inline ones: xterm.js sizes its cells
 * with a <style> element it writes; scripts never run inline.
 */
export function uiCsp(host: string | undefined): string {
  const name = host === undefined ? undefined : hostName(host);
  const self =
    name === undefined || host === undefined
      ? ""
      : ` ws://${host.trim().toLowerCase()} wss://${host.trim().toLowerCase()}`;
  return [
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    `connect-src 'self'${self}`,
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
  ].join("; ");
}

function notBuilt(cause: unknown): BothyError {
  return new BothyError(
    "ui_not_built",
    "The dashboard is not built in this checkout: run `npm run build` (it builds packages/ui), then reload /ui/.",
    { cause },
  );
}

const tags = ["dashboard"];
const DOCS = {
  redirect: { tags, summary: "The dashboard: redirects to /ui/", response: { 308: empty("To /ui/") } },
  page: {
    tags,
    summary: "The dashboard's page (no key needed: it signs in itself)",
    response: { 200: media("text/html", "The page") },
  },
  asset: {
    tags,
    summary: "A dashboard asset, by its content-hashed name (cached for a year)",
    response: { 200: media(["text/javascript", "text/css"], "The asset") },
  },
};

export function uiRoutes(app: FastifyInstance, dist = UI_DIST): void {
  const secure = (request: FastifyRequest, reply: FastifyReply): FastifyReply =>
    reply
      .header("content-security-policy", uiCsp(request.headers.host))
      .header("x-content-type-options", "nosniff")
      .header("referrer-policy", "no-referrer")
      .header("x-frame-options", "DENY");

  app.get("/ui", { schema: DOCS.redirect }, async (_request, reply) => reply.redirect("/ui/", 308));

  app.get("/ui/", { schema: DOCS.page }, async (request, reply) => {
    const html = await readFile(`${dist}index.html`).catch((err: unknown) => {
      throw notBuilt(err);
    });
    return secure(request, reply).type("text/html; charset=utf-8").header("cache-control", "no-cache").send(html);
  });

  app.get<{ Params: { name: string } }>("/ui/assets/:name", { schema: DOCS.asset }, async (request, reply) => {
    const { name } = request.params;
    if (!ASSET_RE.test(name) || name.startsWith("."))
      throw new BothyError(
        "route_not_found",
        `No dashboard asset ${name.slice(0, 100)}; reload /ui/ for the current ones.`,
      );
    const body = await readFile(`${dist}assets/${name}`).catch((err: unknown) => {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
      throw new BothyError(
        "route_not_found",
        `No dashboard asset ${name}: the dashboard was rebuilt or never built; reload /ui/ (or run \`npm run build\`).`,
      );
    });
    return secure(request, reply)
      .type(TYPES[extname(name)] ?? "application/octet-stream")
      .header("cache-control", "public, max-age=31536000, immutable")
      .send(body);
  });
}
