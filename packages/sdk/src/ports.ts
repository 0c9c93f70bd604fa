/**
 * Ports as URLs: what listens inside a sandbox, and the server URL that reaches each port (HTTP
 * and WebSocket, relayed over the guest channel; the sandbox is never opened to the network).
 */
import { linkResponse, portList, type LinkResponse, type ListeningPort } from "@bothy/protocol";
import type { LinkOptions } from "./desktop.ts";
import type { CallOptions, HttpClient } from "./http-client.ts";
import { forwardPort, type ForwardOptions, type PortForward } from "./port-forward.ts";

export type { ListeningPort, ForwardOptions, PortForward };

export class Ports {
  constructor(
    private readonly http: HttpClient,
    private readonly sandboxId: string,
  ) {}

  /** The TCP ports servers listen on inside the sandbox, with the address each is bound to. */
  async list(options: CallOptions = {}): Promise<ListeningPort[]> {
    const path = `/sandboxes/${this.sandboxId}/ports`;
    return (await this.http.json("GET", path, portList, options.signal ? { signal: options.signal } : {})).ports;
  }

  /**
   * The URL that reaches `port` inside the sandbox through the server, e.g.
   * `http://127.0.0.1:8080/sandboxes/sbx_…/ports/8000/`; append the app's own path to it. For a
   * WebSocket, use the same URL with `ws:` (or `wss:`). Requests carry the server's own auth.
   */
  url(port: number, path = "/"): string {
    if (!Number.isInteger(port) || port < 1 || port > 65535)
      throw new RangeError(`${port} is not a TCP port; use a number from 1 to 65535.`);
    const rest = path.startsWith("/") ? path : `/${path}`;
    return `${this.http.baseUrl}/sandboxes/${this.sandboxId}/ports/${port}${rest}`;
  }

  /**
   * A signed link that opens `port` in a browser without an API key until `expires_at` (its
   * first request trades the token for a cookie scoped to that port, so the app's relative links
   * work); `preview_url` too when the server has BOTHY_PREVIEW_DOMAIN. Share it like a key.
   */
  async link(port: number, options: LinkOptions = {}): Promise<LinkResponse> {
    if (!Number.isInteger(port) || port < 1 || port > 65535)
      throw new RangeError(`${port} is not a TCP port; use a number from 1 to 65535.`);
    const { ttlS, ...call } = options;
    const body = ttlS === undefined ? {} : { ttl_s: ttlS };
    return this.http.json("POST", `/sandboxes/${this.sandboxId}/port-links/${port}`, linkResponse, { body, ...call });
  }

  /** `url(port)` without its scheme (`host:port/sandboxes/…/ports/PORT/`), as E2B's `getHost` answers. */
  host(port: number, path = "/"): string {
    return this.url(port, path).replace(/^[a-z]+:\/\//, "");
  }

  /**
   * Listens on a local loopback port and relays every connection to `port` inside the sandbox
   * (raw TCP through the server, any protocol). Node only.
   */
  forward(port: number, options: ForwardOptions = {}): Promise<PortForward> {
    if (!Number.isInteger(port) || port < 1 || port > 65535)
      throw new RangeError(`${port} is not a TCP port; use a number from 1 to 65535.`);
    return forwardPort(this.http, this.sandboxId, port, options);
  }
}
