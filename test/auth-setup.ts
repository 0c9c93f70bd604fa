/**
 * Every integration test file runs with one admin key: each server a test starts (in process or
 * as `bothy serve`) mints it at its first start (BOTHY_ADMIN_KEY), and every client sends it —
 * the SDK and CLI read BOTHY_API_KEY; fetch and node:http (so `ws` too) to a loopback or private
 * address get `Authorization: Bearer` added when the request names no key itself. A request that must go
 * without a key sends the ANONYMOUS header (test/auth.ts), which is removed before it leaves.
 */
import { randomBytes } from "node:crypto";
import http from "node:http";
import { syncBuiltinESMExports } from "node:module";
import { ANONYMOUS_HEADER } from "./auth.ts";

const key = `bothy_${randomBytes(32).toString("hex")}`;
process.env["BOTHY_ADMIN_KEY"] = key;
process.env["BOTHY_API_KEY"] = key;

const LOOPBACK = new Set(["127.0.0.1", "localhost", "[::1]", "::1"]);
/** Loopback, and the private addresses of the namespaces tests build (a server on a test's control link). */
const PRIVATE = /^(127\.|10\.|192\.168\.|172\.(1[6-9]|2\d|3[01])\.)\d+\.\d+(\.\d+)?$/;

function loopback(host: string | null | undefined): boolean {
  if (!host) return false;
  const name = host.replace(/:\d+$/, "");
  return LOOPBACK.has(name) || PRIVATE.test(name);
}

/** Adds the key unless the headers name one; removes the anonymous marker. */
function withKey(headers: Headers): Headers {
  if (headers.has(ANONYMOUS_HEADER)) headers.delete(ANONYMOUS_HEADER);
  else if (!headers.has("authorization") && !headers.has("x-api-key")) headers.set("authorization", `Bearer ${key}`);
  return headers;
}

const originalFetch = globalThis.fetch;
globalThis.fetch = (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
  const url = new URL(input instanceof Request ? input.url : input.toString());
  if (!loopback(url.hostname)) return originalFetch(input, init);
  const headers = withKey(new Headers(init?.headers ?? (input instanceof Request ? input.headers : undefined)));
  return originalFetch(input, { ...init, headers });
};

type Outgoing = http.RequestOptions & { headers?: http.OutgoingHttpHeaders };

function patchOptions(options: Outgoing): Outgoing {
  if (!loopback(options.hostname ?? options.host)) return options;
  const given = Object.fromEntries(Object.entries(options.headers ?? {}).map(([k, v]) => [k.toLowerCase(), v]));
  if (ANONYMOUS_HEADER in given) {
    delete given[ANONYMOUS_HEADER];
    return { ...options, headers: given };
  }
  if ("authorization" in given || "x-api-key" in given) return options;
  return { ...options, headers: { ...given, authorization: `Bearer ${key}` } };
}

/** node:http's (url?, options?, callback?) forms, with the key added to the options. */
function patchArgs(args: unknown[]): unknown[] {
  const [first, second, ...rest] = args;
  if (typeof first === "string" || first instanceof URL) {
    const url = new URL(first);
    const options: Outgoing = typeof second === "object" && second !== null ? (second as Outgoing) : {};
    const patched = patchOptions({ ...options, hostname: options.hostname ?? url.hostname });
    return typeof second === "function" ? [url, patched, second, ...rest] : [url, patched, ...rest];
  }
  if (typeof first === "object" && first !== null) return [patchOptions(first as Outgoing), second, ...rest];
  return args;
}

const originalRequest = http.request;
const originalGet = http.get;
http.request = ((...args: unknown[]) =>
  (originalRequest as (...a: unknown[]) => http.ClientRequest)(...patchArgs(args))) as typeof http.request;
http.get = ((...args: unknown[]) =>
  (originalGet as (...a: unknown[]) => http.ClientRequest)(...patchArgs(args))) as typeof http.get;
syncBuiltinESMExports();
