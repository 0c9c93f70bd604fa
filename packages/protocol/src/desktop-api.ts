/**
 * The desktop of a sandbox (template `desktop`): start it, take screenshots, and drive mouse and
 * keyboard in screenshot pixels. The same calls back the REST routes, the SDK and the agent tools.
 */
import { z } from "zod";

export const DESKTOP_DEFAULT_WIDTH = 1280;
export const DESKTOP_DEFAULT_HEIGHT = 800;

/** POST /sandboxes/{id}/desktop/start. The size applies when the desktop starts; a running one keeps its own. */
export const desktopStartRequest = z
  .object({
    width: z.number().int().min(320).max(3840).default(DESKTOP_DEFAULT_WIDTH),
    height: z.number().int().min(240).max(2160).default(DESKTOP_DEFAULT_HEIGHT),
  })
  .strict();
export type DesktopStartRequest = z.input<typeof desktopStartRequest>;

export const desktopInfo = z.object({
  /** The X display inside the sandbox (`DISPLAY`). */
  display: z.string(),
  width: z.number().int().positive(),
  height: z.number().int().positive(),
  /** Inside the sandbox: the VNC server (loopback only) and Chromium's DevTools port. */
  vnc_port: z.number().int().min(1).max(65535),
  cdp_port: z.number().int().min(1).max(65535),
  /** What this call started (empty when everything already ran). */
  started: z.array(z.string()),
});
export type DesktopInfo = z.infer<typeof desktopInfo>;

/**
 * xdotool key names joined by `+` for a chord, chords separated by spaces:
 * `Return`, `ctrl+l`, `ctrl+shift+Tab`, `Down Down Return`.
 */
export const DESKTOP_KEYS_RE = /^[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*( [A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*){0,31}$/;

const coordinate = z.number().int().min(0).max(3839);

export const desktopAction = z.discriminatedUnion("action", [
  z.object({ action: z.literal("move"), x: coordinate, y: coordinate }).strict(),
  z
    .object({
      action: z.literal("click"),
      x: coordinate,
      y: coordinate,
      button: z.enum(["left", "middle", "right"]).default("left"),
      /** 2 for a double click, 3 for a triple click. */
      count: z.number().int().min(1).max(3).default(1),
    })
    .strict(),
  z.object({ action: z.literal("type"), text: z.string().min(1).max(10_000) }).strict(),
  z.object({ action: z.literal("key"), keys: z.string().max(400).regex(DESKTOP_KEYS_RE) }).strict(),
  z
    .object({
      action: z.literal("scroll"),
      x: coordinate,
      y: coordinate,
      direction: z.enum(["up", "down", "left", "right"]),
      /** Wheel clicks. */
      amount: z.number().int().min(1).max(50).default(3),
    })
    .strict(),
]);
export type DesktopAction = z.input<typeof desktopAction>;

export const desktopActionResult = z.object({ action: z.string(), width: z.number().int(), height: z.number().int() });
export type DesktopActionResult = z.infer<typeof desktopActionResult>;

/** `POST /sandboxes/{id}/desktop/link` and `POST /sandboxes/{id}/port-links/{port}`: a signed, expiring link. */
export const linkRequest = z
  .object({
    /** Desktop links only: mouse and keyboard pass on (needs sandboxes:write). */
    control: z.boolean().optional(),
    ttl_s: z.number().int().min(1).max(86_400).default(3600),
  })
  .strict();
export type LinkRequest = z.input<typeof linkRequest>;

export const linkResponse = z.object({
  /** Opens without an API key until expires_at; keep it as secret as a key. */
  url: z.string(),
  /** The preview host form of a port link, when the server has BOTHY_PREVIEW_DOMAIN. */
  preview_url: z.string().optional(),
  expires_at: z.string(),
});
export type LinkResponse = z.infer<typeof linkResponse>;
