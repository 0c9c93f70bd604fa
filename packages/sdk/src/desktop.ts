/**
 * A sandbox's desktop (template `desktop`): screenshots, mouse and keyboard in screenshot
 * pixels, the live view's URL and Chromium's DevTools endpoint for Playwright. The desktop starts
 * on the first call that needs it; `start()` starts it explicitly (and chooses the screen size).
 */
import {
  desktopActionResult,
  desktopInfo,
  linkResponse,
  type LinkResponse,
  type DesktopAction,
  type DesktopActionResult,
  type DesktopInfo,
  type DesktopStartRequest,
} from "@bothy/protocol";
import type { CallOptions, HttpClient } from "./http-client.ts";

export type { DesktopAction, DesktopActionResult, DesktopInfo, LinkResponse };

/** What a link is asked for with: its lifetime in seconds (default 3600, at most 86400). */
export interface LinkOptions extends CallOptions {
  ttlS?: number;
}

export interface Screenshot {
  png: Uint8Array;
  width: number;
  height: number;
}

export type MouseButton = "left" | "middle" | "right";

export class Desktop {
  constructor(
    private readonly http: HttpClient,
    private readonly sandboxId: string,
  ) {}

  private path(rest: string): string {
    return `/sandboxes/${this.sandboxId}/desktop${rest}`;
  }

  /** Starts Xvfb, the window manager, the VNC server and Chromium where not running; the size applies to a new screen. */
  async start(size: DesktopStartRequest = {}, options: CallOptions = {}): Promise<DesktopInfo> {
    return this.http.json("POST", this.path("/start"), desktopInfo, { body: size, ...options });
  }

  /** The screen as a PNG; action coordinates are its pixels. */
  async screenshot(options: CallOptions = {}): Promise<Screenshot> {
    const res = await this.http.fetch("GET", this.path("/screenshot"), options);
    return {
      png: new Uint8Array(await res.arrayBuffer()),
      width: Number(res.headers.get("x-screen-width")),
      height: Number(res.headers.get("x-screen-height")),
    };
  }

  /** Any one action (the wire form): `{ action: "click", x, y }`, `{ action: "type", text }`, ... */
  async act(action: DesktopAction, options: CallOptions = {}): Promise<DesktopActionResult> {
    return this.http.json("POST", this.path("/actions"), desktopActionResult, { body: action, ...options });
  }

  move(x: number, y: number, options: CallOptions = {}): Promise<DesktopActionResult> {
    return this.act({ action: "move", x, y }, options);
  }

  click(
    x: number,
    y: number,
    click: { button?: MouseButton; count?: number } = {},
    options: CallOptions = {},
  ): Promise<DesktopActionResult> {
    return this.act({ action: "click", x, y, ...click }, options);
  }

  /** Types text as keystrokes into whatever has the focus. */
  type(text: string, options: CallOptions = {}): Promise<DesktopActionResult> {
    return this.act({ action: "type", text }, options);
  }

  /** xdotool key names: `Return`, `ctrl+l`, `ctrl+shift+Tab`, several separated by spaces. */
  key(keys: string, options: CallOptions = {}): Promise<DesktopActionResult> {
    return this.act({ action: "key", keys }, options);
  }

  scroll(
    x: number,
    y: number,
    direction: "up" | "down" | "left" | "right",
    amount?: number,
    options: CallOptions = {},
  ): Promise<DesktopActionResult> {
    return this.act({ action: "scroll", x, y, direction, ...(amount === undefined ? {} : { amount }) }, options);
  }

  /** The live view (noVNC) a person opens in a browser; `control` lets them use mouse and keyboard too. */
  viewerUrl(control = false): string {
    return this.http.url(this.path(""), control ? { control: 1 } : undefined);
  }

  /**
   * A signed link to the live view that opens in a browser without an API key until
   * `expires_at`: view only, or with `control` mouse and keyboard too (needs sandboxes:write).
   * Anyone holding it can watch: share it like a key, for as short a time as will do.
   */
  async viewerLink(options: LinkOptions & { control?: boolean } = {}): Promise<LinkResponse> {
    const { control, ttlS, ...call } = options;
    const body = { ...(control === undefined ? {} : { control }), ...(ttlS === undefined ? {} : { ttl_s: ttlS }) };
    return this.http.json("POST", this.path("/link"), linkResponse, { body, ...call });
  }

  /**
   * The endpoint for Playwright's `chromium.connectOverCDP(url)` (or Puppeteer's `browserURL`):
   * the sandbox's Chromium, through the server. Starts the desktop first.
   */
  async cdpUrl(options: CallOptions = {}): Promise<string> {
    await this.start({}, options);
    return this.http.url(this.path("/cdp"));
  }
}
