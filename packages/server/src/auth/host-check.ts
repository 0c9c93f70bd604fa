/**
 * With BOTHY_AUTH=none whatever reaches the port may do anything, and a web page can reach a
 * loopback port: a page on evil.example whose name is then made to resolve to 127.0.0.1 (DNS
 * rebinding) is same-origin with its own requests to the server, which carry `Host:
 * evil.example`. So such a server answers only requests that name it: a loopback name or
 * address, BOTHY_HOST, or the preview domain and its `{port}-{id}.` names.
 */
import { isIP } from "node:net";

export interface HostNames {
  /** BOTHY_HOST: the address or name the server listens on. */
  bindHost: string;
  /** BOTHY_PREVIEW_DOMAIN, when set. */
  previewDomain: string | undefined;
}

/** The host name of a Host header (lower case, without port or trailing dot); undefined when malformed. */
export function hostName(header: string): string | undefined {
  const value = header.trim().toLowerCase();
  const bracketed = /^(\[[0-9a-f:.]+\])(:[0-9]{1,5})?$/.exec(value);
  if (bracketed) return bracketed[1];
  const named = /^([a-z0-9._-]+)(:[0-9]{1,5})?$/.exec(value);
  const name = named?.[1]?.replace(/\.$/, "");
  return name === undefined || name === "" ? undefined : name;
}

function isLoopbackName(name: string): boolean {
  if (name === "localhost" || name.endsWith(".localhost")) return true;
  if (name === "[::1]") return true;
  return isIP(name) === 4 && name.startsWith("127.");
}

/** Whether a request naming `header` in Host is one for this server (see above). */
export function hostAllowed(header: string, names: HostNames): boolean {
  const name = hostName(header);
  if (name === undefined) return false;
  if (isLoopbackName(name)) return true;
  const bind = hostName(
    names.bindHost.includes(":") && !names.bindHost.startsWith("[") ? `[${names.bindHost}]` : names.bindHost,
  );
  if (bind !== undefined && name === bind) return true;
  const domain = names.previewDomain;
  return domain !== undefined && (name === domain || name.endsWith(`.${domain}`));
}
