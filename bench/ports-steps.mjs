// Loaded into bench/ports' server with `--import` (bench/ports --steps): for each proxied request,
// when each of the proxy's steps ended, from Node's and Fastify's diagnostics channels and a
// wrapper around http.request (no code of the server's is changed). Steps, in milliseconds:
//   hooks    the request parsed → the route's handler starts (routing, auth, tenant and origin checks)
//   lookup   → http.request is called (the sandbox's agent and address, the pool or a dial, headers)
//   upstream → the answer's head is parsed (the request written, gVisor, the app, back to the
//              server, including any wait of the server's for a core)
//   relay    → the client's response is ended (head rewritten, body piped on)
//   flush    → its last write has completed (a write into a socket can run the woken reader first)
// `server` is hooks to relay: what the server takes before the whole answer is on its way.
// With them, the bytes and chunks the body came in, how often the relay paused the body for a full
// client socket, and whether the upstream socket was a pooled one. The bench sends one request at
// a time, so the next http.request call belongs to the proxied request whose handler started last.
// Records stay in memory and are written at exit to BENCH_STEPS_FILE, one JSON line each, with the
// client's `x-bench-phase` header as `phase`.
import dc from "node:diagnostics_channel";
import { writeFileSync } from "node:fs";
import http from "node:http";
import { syncBuiltinESMExports } from "node:module";

const file = process.env.BENCH_STEPS_FILE;
const now = () => Number(process.hrtime.bigint()) / 1e6;
/** Server requests (IncomingMessage) to their records. */
const records = new Map();
/** Records whose handler started and whose request to the sandbox is not made yet. */
const waiting = [];
/** Requests to the sandbox (ClientRequest) to the records they serve. */
const upstream = new WeakMap();
const done = [];

if (file) {
  dc.subscribe("http.server.request.start", ({ request, response }) => {
    if (!/\/ports\/\d+/.test(request.url ?? "")) return;
    const phase = request.headers["x-bench-phase"];
    const r = { phase: typeof phase === "string" ? phase : "other", t0: now(), bytes: 0, chunks: 0, pauses: 0 };
    records.set(request, r);
    const end = response.end;
    response.end = function (...args) {
      r.ended ??= now();
      return end.apply(this, args);
    };
  });
  dc.subscribe("tracing:fastify.request.handler:start", ({ request }) => {
    const r = records.get(request.raw);
    if (r === undefined) return;
    r.handler = now();
    waiting.push(r);
  });
  const request = http.request;
  http.request = function (...args) {
    const r = waiting.shift();
    if (r !== undefined) r.client = now();
    const req = request.apply(this, args);
    if (r !== undefined) upstream.set(req, r);
    return req;
  };
  // The server imports `request` from node:http as an ES module: this makes it see the wrapper.
  syncBuiltinESMExports();
  dc.subscribe("http.client.response.finish", ({ request, response }) => {
    const r = upstream.get(request);
    if (r === undefined) return;
    r.head = now();
    r.reused = request.reusedSocket === true;
    response.on("data", (chunk) => {
      r.bytes += chunk.length;
      r.chunks += 1;
    });
    response.on("pause", () => (r.pauses += 1));
  });
  dc.subscribe("http.server.response.finish", ({ request }) => {
    const r = records.get(request);
    if (r === undefined) return;
    records.delete(request);
    const end = now();
    const step = (from, to) => (from === undefined || to === undefined ? null : +(to - from).toFixed(3));
    done.push({
      phase: r.phase,
      hooks: step(r.t0, r.handler),
      lookup: step(r.handler, r.client),
      upstream: step(r.client, r.head),
      relay: step(r.head, r.ended),
      flush: step(r.ended, end),
      server: step(r.t0, r.ended),
      bytes: r.bytes,
      chunks: r.chunks,
      pauses: r.pauses,
      reused: r.reused ?? null,
    });
  });
  process.on("exit", () => writeFileSync(file, done.map((d) => JSON.stringify(d)).join("\n") + "\n"));
}
