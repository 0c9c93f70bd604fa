/**
 * The API client of bench/commands, run as a process of its own (forked, over IPC), as a user's
 * SDK always is: its WebSocket handshakes, framing, JSON and fetch then cost CPU in this process,
 * not on the server's event loop. Each request from the parent runs one `true` and answers the
 * round trip as this process timed it.
 */
import WebSocket from "ws";

export type ClientRequest =
  | { op: "setup"; url: string; wsUrl: string; sandboxId: string; apiKey: string }
  | { op: "ws" | "wsKept" | "http"; cmd: string };
/** `ms` to the end of the call; on a WebSocket, `exitedMs` to `process_exited` (where the SDK's `run` resolves). */
export type ClientAnswer = { ok: true; ms: number; exitedMs?: number } | { ok: false; error: string };

let target: Extract<ClientRequest, { op: "setup" }> | undefined;

/**
 * One command on a WebSocket of its own, as the SDK runs one: connect, send, read to the close.
 * Answers when `process_exited` came, since `t0`.
 */
function viaWebSocket(t: NonNullable<typeof target>, cmd: string, t0: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${t.wsUrl}/sandboxes/${t.sandboxId}/command`, {
      headers: { authorization: `Bearer ${t.apiKey}` },
    });
    let exitCode: unknown;
    let exitedMs = NaN;
    ws.on("open", () => ws.send(JSON.stringify({ cmd })));
    ws.on("message", (data) => {
      const ev = JSON.parse(data.toString()) as { type: string; exit_code?: unknown };
      if (ev.type === "process_exited") {
        exitCode = ev.exit_code;
        exitedMs = performance.now() - t0;
      }
    });
    ws.on("unexpected-response", (_req, res) => reject(new Error(`upgrade refused: ${res.statusCode}`)));
    ws.on("error", reject);
    ws.on("close", () => (exitCode === 0 ? resolve(exitedMs) : reject(new Error(`exit ${String(exitCode)}`))));
  });
}

/** The kept socket (`?keep=true`) of the "wsKept" series, opened by its first command. */
let kept: { ws: WebSocket; onEvent: ((ev: { type: string; exit_code?: unknown }) => void) | undefined } | undefined;

async function keptSocket(t: NonNullable<typeof target>): Promise<NonNullable<typeof kept>> {
  if (kept && kept.ws.readyState === WebSocket.OPEN) return kept;
  const ws = new WebSocket(`${t.wsUrl}/sandboxes/${t.sandboxId}/command?keep=true`, {
    headers: { authorization: `Bearer ${t.apiKey}` },
  });
  // Its first frame is `ready`: the socket takes commands.
  await new Promise((resolve, reject) => {
    ws.once("message", resolve);
    ws.once("error", reject);
  });
  const k: NonNullable<typeof kept> = { ws, onEvent: undefined };
  ws.on("message", (data) => k.onEvent?.(JSON.parse(data.toString()) as { type: string; exit_code?: unknown }));
  kept = k;
  return k;
}

/**
 * One command on a WebSocket kept across commands, as the SDK's `commands.run` runs one: send,
 * read to `process_exited` (the next command may go at once; the `ready` after it is not waited for).
 */
async function viaKeptWebSocket(t: NonNullable<typeof target>, cmd: string): Promise<void> {
  const k = await keptSocket(t);
  await new Promise<void>((resolve, reject) => {
    const onClose = (code: number): void => reject(new Error(`the kept socket closed (${code})`));
    k.ws.once("close", onClose);
    k.onEvent = (ev) => {
      if (ev.type !== "process_exited" && ev.type !== "error") return;
      k.ws.off("close", onClose);
      k.onEvent = undefined;
      if (ev.type === "process_exited" && ev.exit_code === 0) resolve();
      else reject(new Error(`kept socket: ${JSON.stringify(ev)}`));
    };
    k.ws.send(JSON.stringify({ cmd }));
  });
}

/** One command as one POST on Node's fetch, whose shared dispatcher keeps the connection alive. */
async function viaHttp(t: NonNullable<typeof target>, cmd: string): Promise<void> {
  const res = await fetch(`${t.url}/sandboxes/${t.sandboxId}/commands`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${t.apiKey}` },
    body: JSON.stringify({ cmd }),
  });
  const body = (await res.json()) as { exit_code?: unknown };
  if (res.status !== 200 || body.exit_code !== 0)
    throw new Error(`POST commands: ${res.status} ${JSON.stringify(body)}`);
}

process.on("message", (msg: ClientRequest) => {
  const answer = (a: ClientAnswer): void => void process.send?.(a);
  if (msg.op === "setup") {
    target = msg;
    return answer({ ok: true, ms: 0 });
  }
  if (!target) return answer({ ok: false, error: "no setup" });
  const t0 = performance.now();
  const run = { ws: viaWebSocket, wsKept: viaKeptWebSocket, http: viaHttp }[msg.op];
  run(target, msg.cmd, t0).then(
    (exitedMs) => answer({ ok: true, ms: performance.now() - t0, ...(exitedMs === undefined ? {} : { exitedMs }) }),
    (err: unknown) => answer({ ok: false, error: err instanceof Error ? err.message : String(err) }),
  );
});
process.on("disconnect", () => process.exit(0));
