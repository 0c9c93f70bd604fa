/**
 * `@e2b/desktop`'s live view (`stream.start()`, `stream.getUrl()`) on bothy's own viewer. The
 * SDK starts x11vnc and noVNC by commands (e2b/desktop-commands.ts answers them) and builds the
 * URL itself: `https://{port}-{sandbox id}.{domain}/vnc.html?...&password=PW`. bothy serves that
 * preview host with its noVNC page, relayed to the VNC server it already runs in the sandbox.
 *
 * An E2B stream without a password is open to anyone who knows the sandbox id; bothy's sandbox
 * ids are not secrets, so a stream needs `requireAuth: true`: the password the SDK makes (and
 * sends in its `x11vnc -storepasswd` command) is the credential, checked here in constant time,
 * and bound to the key whose envd token started the stream (revoking that key ends it).
 * Kept in memory: a server restart ends every stream (start it again).
 */
import { timingSafeEqual } from "node:crypto";
import type { IncomingMessage } from "node:http";

interface OpenStream {
  port: number;
  password: string;
  /** The key binding (auth/key-bindings.ts) of the envd token that started it. */
  binding: string;
}

/** Where the rewrite below sends a stream host's page. */
export const STREAM_PAGE_PREFIX = "/e2b/desktop-stream";

export class DesktopStreams {
  /** Passwords stored by `x11vnc -storepasswd`, waiting for the stream that uses them. */
  private readonly passwords = new Map<string, string>();
  private readonly open = new Map<string, OpenStream>();

  setPassword(sandboxId: string, password: string): void {
    this.passwords.set(sandboxId, password);
  }

  hasPassword(sandboxId: string): boolean {
    return this.passwords.has(sandboxId);
  }

  /** The stream is served on `port` of the sandbox's preview host from now on. */
  start(sandboxId: string, port: number, binding: string): boolean {
    const password = this.passwords.get(sandboxId);
    if (password === undefined) return false;
    this.open.set(sandboxId, { port, password, binding });
    return true;
  }

  stop(sandboxId: string): void {
    this.open.delete(sandboxId);
  }

  /** Whether a stream is served (on `port`, when given). */
  isOpen(sandboxId: string, port?: number): boolean {
    const stream = this.open.get(sandboxId);
    return stream !== undefined && (port === undefined || stream.port === port);
  }

  forget(sandboxId: string): void {
    this.open.delete(sandboxId);
    this.passwords.delete(sandboxId);
  }

  /** The binding of the sandbox's stream when `password` is its password; else undefined. */
  verify(sandboxId: string, password: string | undefined): string | undefined {
    const stream = this.open.get(sandboxId);
    if (stream === undefined || password === undefined) return undefined;
    const a = Buffer.from(stream.password);
    const b = Buffer.from(password);
    return a.length === b.length && timingSafeEqual(a, b) ? stream.binding : undefined;
  }

  /**
   * For Fastify's `rewriteUrl`: a request whose Host is `{port}-{id}.{domain}` for a sandbox that
   * serves its stream on that port. Its page goes to bothy's stream route, the noVNC files and
   * the VNC WebSocket the page loads keep bothy's own paths, anything else is not found (nothing
   * listens on that port inside). Undefined for any other request.
   */
  rewrite(domain: string): (req: IncomingMessage) => string | undefined {
    const suffix = `.${domain}`;
    return (req) => {
      const host = (req.headers.host ?? "").toLowerCase().replace(/:\d+$/, "");
      if (!host.endsWith(suffix)) return undefined;
      const match = /^([0-9]{1,5})-(sbx_[a-z2-7]{20})$/.exec(host.slice(0, -suffix.length));
      if (!match || !this.isOpen(match[2]!, Number(match[1]))) return undefined;
      const id = match[2]!;
      const url = req.url ?? "/";
      const path = url.split("?")[0] ?? "/";
      if (path.startsWith("/desktop/novnc/") || path === `/sandboxes/${id}/desktop/vnc`) return url;
      if (path === "/vnc.html") return `${STREAM_PAGE_PREFIX}/${id}${url}`;
      return `${STREAM_PAGE_PREFIX}/${id}/not-found`;
    };
  }
}
