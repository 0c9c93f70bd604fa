import http, { type IncomingMessage, type ServerResponse } from "node:http";
import https from "node:https";
import { BothyError } from "@bothy/protocol";
import { endToEnd } from "../api/port-routes.ts";
import { FORWARDED_HEADER } from "./cluster-secret.ts";

/** How long a node may take to accept a forwarded connection; past it the caller gets `node_unreachable`. */
export const CONNECT_MS = 10_000;

/** One keep-alive pool per scheme for the calls a node forwards, so a round trip costs no new connection. */
const agents = {
  "http:": new http.Agent({ keepAlive: true, maxSockets: 256 }),
  "https:": new https.Agent({ keepAlive: true, maxSockets: 256 }),
};

export interface ForwardTarget {
  nodeId: string;
  /** The owner's BOTHY_NODE_URL. */
  url: string;
}

export function unreachable(target: ForwardTarget, why: string): BothyError {
  return new BothyError(
    "node_unreachable",
    `The node that runs this (${target.nodeId}) did not answer: ${why}. Retry shortly; if it persists, that node is down and its sandboxes show stopped until it is back.`,
    { details: { node_id: target.nodeId } },
  );
}

/**
 * Sends a request on to the node that answers it, as the caller sent it (method, URL, headers with
 * its credentials; hop-by-hop ones aside) plus the forwarding signature, and resolves with the
 * owner's answer once its head has come: the caller passes that on unchanged. The request's body is
 * streamed (pipe: the owner's pace holds the caller's), or `body` is sent instead where the
 * receiving node has read it already. Rejects with `node_unreachable` if the owner cannot be reached
 * or fails before answering.
 */
export function forwardHttp(
  req: IncomingMessage,
  out: ServerResponse,
  /** The URL as the caller sent it (before any rewrite of this node's: the owner makes its own). */
  path: string,
  target: ForwardTarget,
  signature: string,
  body?: Buffer,
): Promise<IncomingMessage> {
  const base = new URL(target.url);
  const headers = endToEnd(req.headers);
  headers[FORWARDED_HEADER] = signature;
  if (body !== undefined) headers["content-length"] = String(body.length);
  const transport = base.protocol === "https:" ? https : http;
  return new Promise((resolve, reject) => {
    const upstream = transport.request({
      protocol: base.protocol,
      hostname: base.hostname,
      port: base.port,
      method: req.method,
      path,
      headers,
      agent: base.protocol === "https:" ? agents["https:"] : agents["http:"],
    });
    let answered = false;
    upstream.on("socket", (socket) => {
      if (!socket.connecting) return;
      const timer = setTimeout(
        () => upstream.destroy(unreachable(target, `no connection within ${CONNECT_MS / 1000} s`)),
        CONNECT_MS,
      );
      socket.once("connect", () => clearTimeout(timer));
      socket.once("close", () => clearTimeout(timer));
    });
    upstream.on("response", (res) => {
      answered = true;
      resolve(res);
    });
    upstream.on("error", (err) => {
      if (!answered) reject(err instanceof BothyError ? err : unreachable(target, err.message));
    });
    // A caller that leaves before the answer has gone stops the forwarded request too.
    out.once("close", () => {
      if (!out.writableFinished) upstream.destroy();
    });
    if (body !== undefined) upstream.end(body);
    else req.pipe(upstream);
  });
}

/** Passes the owner's answer on unchanged (status, end-to-end headers, body streamed with backpressure). */
export function relayAnswer(res: IncomingMessage, out: ServerResponse): void {
  out.writeHead(res.statusCode ?? 502, res.statusMessage, endToEnd(res.headers));
  res.pipe(out);
  res.once("error", () => out.destroy());
  res.once("aborted", () => out.destroy());
  out.once("close", () => res.destroy());
}
