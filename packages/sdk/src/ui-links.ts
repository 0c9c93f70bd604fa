/**
 * One-time sign-in links for the dashboard (`POST /ui/links`): what `bothy ui-link` prints. The
 * link signs a browser in once, as the calling key, within its lifetime; the key itself is never
 * in it.
 */
import { uiLinkInfo } from "@bothy/protocol";
import type { AdminOptions } from "./admin.ts";
import { HttpClient } from "./http-client.ts";

export interface UiLinkOptions extends AdminOptions {
  /** How long the link may be used, in seconds (30 to 3600; the server's default is 300). */
  ttlS?: number;
}

export interface UiLink {
  /** The whole link: the server's URL, `/ui/`, and the token in the fragment. */
  url: string;
  expires_at: string;
}

export const UiLinks = {
  async create(options: UiLinkOptions = {}): Promise<UiLink> {
    const client = new HttpClient(options);
    const made = await client.json("POST", "/ui/links", uiLinkInfo, {
      body: options.ttlS === undefined ? {} : { ttl_s: options.ttlS },
      ...(options.signal ? { signal: options.signal } : {}),
    });
    return { url: `${client.baseUrl}${made.path}`, expires_at: made.expires_at };
  },
};
