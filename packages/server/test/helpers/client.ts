/**
 * Test clients of the API. Sandboxes are made with the SDK; `api` and `runCommand` stay raw on
 * purpose: tests use them to check exact statuses, problem bodies, frames and close codes, and to
 * send what a well-behaved client never would.
 */
import WebSocket from "ws";
import type { CommandEvent } from "@bothy/protocol";
import { Sandbox, type SandboxCreateOptions } from "@bothy/sdk";

export async function api(
  base: string,
  method: string,
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; type: string; json: Record<string, unknown> }> {
  const res = await fetch(`${base}${path}`, {
    method,
    headers: body === undefined ? headers : { "content-type": "application/json", ...headers },
    body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
  });
  const text = await res.text();
  return {
    status: res.status,
    type: res.headers.get("content-type") ?? "",
    json: text ? (JSON.parse(text) as Record<string, unknown>) : {},
  };
}

/**
 * `POST /sandboxes/{id}/commands` from a client that will leave before the answer: `abort` drops
 * the request; `settled` resolves with what fetch ended with (the abort's error, or the response).
 */
export function abandonableCommand(
  base: string,
  id: string,
  cmd: string,
): { abort(): void; settled: Promise<unknown> } {
  const abort = new AbortController();
  const settled = fetch(`${base}/sandboxes/${id}/commands`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ cmd }),
    signal: abort.signal,
  }).catch((err: unknown) => err);
  return { abort: () => abort.abort(), settled };
}

/**
 * Deletes a sandbox and waits until its teardown on the host has ended. DELETE answers as soon as
 * the sandbox is `deleting` (the host finishes in the background), so a test that then looks at
 * the host waits for `deleted` by polling GET. Answers the final state.
 */
export async function deleteSandbox(base: string, id: string): Promise<string> {
  const res = await api(base, "DELETE", `/sandboxes/${id}`);
  if (res.status !== 200) throw new Error(`DELETE ${id} answered ${res.status}: ${JSON.stringify(res.json)}`);
  return waitDeleted(base, id);
}

/** Polls GET until the sandbox is `deleted` (or `failed`); throws with its state after `timeoutMs`. */
export async function waitDeleted(base: string, id: string, timeoutMs = 60_000): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const state = String((await api(base, "GET", `/sandboxes/${id}`)).json["state"]);
    if (state === "deleted" || state === "failed") return state;
    if (Date.now() > deadline) throw new Error(`${id} is still ${state} ${timeoutMs} ms after its delete`);
    await new Promise((r) => setTimeout(r, 20)); // the poll's pace, not a wait for an outcome
  }
}

/** Polls `check` at a short pace until it holds; throws naming `what` after `timeoutMs`. */
export async function pollUntil(
  what: string,
  check: () => boolean | Promise<boolean>,
  timeoutMs = 30_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20)); // the poll's pace, not a wait for an outcome
  }
}

/** A sandbox's state, as GET /sandboxes/{id} answers it. */
export async function sandboxState(base: string, id: string): Promise<string> {
  return String((await api(base, "GET", `/sandboxes/${id}`)).json["state"]);
}

/** Polls GET until the sandbox is in `want`, for up to `seconds`; answers the last state seen. */
export async function waitForState(base: string, id: string, want: string, seconds: number): Promise<string> {
  const deadline = Date.now() + seconds * 1000;
  let state = await sandboxState(base, id);
  while (state !== want && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 250)); // the poll's pace, not a wait for an outcome
    state = await sandboxState(base, id);
  }
  return state;
}

/** Polls GET /sandboxes until no sandbox is `deleting`: every teardown under way has ended. */
export async function waitNoneDeleting(base: string, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const list = (await api(base, "GET", "/sandboxes")).json["sandboxes"] as Array<{ state: string }>;
    const deleting = list.filter((s) => s.state === "deleting").length;
    if (deleting === 0) return;
    if (Date.now() > deadline) throw new Error(`${deleting} sandboxes still deleting after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 20)); // the poll's pace, not a wait for an outcome
  }
}

/** Creates a sandbox through the SDK and answers its id (a refused create throws the SDK's typed error). */
export async function createSandbox(
  baseUrl: string,
  options: SandboxCreateOptions = { template: "seed", vcpu: 1, memoryMib: 512 },
): Promise<string> {
  // The SDK takes camelCase options and ignores others: a wire name here would silently not apply.
  const wireNames = Object.keys(options).filter((k) => k.includes("_"));
  if (wireNames.length > 0) throw new Error(`createSandbox takes SDK option names, not ${wireNames.join(", ")}`);
  return (await Sandbox.create({ baseUrl, ...options })).sandboxId;
}

export interface TimedEvent {
  at: number;
  event: CommandEvent;
}

export interface CommandResult {
  events: TimedEvent[];
  stdout: string;
  stderr: string;
  exit: Extract<CommandEvent, { type: "process_exited" }> | undefined;
  error: Extract<CommandEvent, { type: "error" }> | undefined;
  closeCode: number;
}

/** Runs one command over the WebSocket and collects everything until the socket closes. */
export function runCommand(
  wsBase: string,
  sandboxId: string,
  request: Record<string, unknown> | string,
  options: { onEvent?: (ev: CommandEvent, ws: WebSocket) => void; keepEvents?: boolean } = {},
): Promise<CommandResult> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${wsBase}/sandboxes/${sandboxId}/command`);
    const t0 = Date.now();
    const result: CommandResult = {
      events: [],
      stdout: "",
      stderr: "",
      exit: undefined,
      error: undefined,
      closeCode: 0,
    };
    const out: Record<"stdout" | "stderr", string[]> = { stdout: [], stderr: [] };
    ws.on("open", () => ws.send(typeof request === "string" ? request : JSON.stringify(request)));
    ws.on("message", (data) => {
      const ev = JSON.parse(data.toString()) as CommandEvent;
      if (options.keepEvents !== false) result.events.push({ at: Date.now() - t0, event: ev });
      if (ev.type === "stdout" || ev.type === "stderr")
        out[ev.type].push(ev.encoding === "base64" ? Buffer.from(ev.data, "base64").toString("latin1") : ev.data);
      if (ev.type === "process_exited") result.exit = ev;
      if (ev.type === "error") result.error = ev;
      options.onEvent?.(ev, ws);
    });
    ws.on("unexpected-response", (_req, res) => reject(new Error(`upgrade refused: ${res.statusCode}`)));
    ws.on("error", reject);
    ws.on("close", (code) => {
      result.closeCode = code;
      result.stdout = out.stdout.join("");
      result.stderr = out.stderr.join("");
      resolve(result);
    });
  });
}

/** Writes a file into a sandbox through the files API; throws with the answer unless it is 200. */
export async function putSandboxFile(base: string, sandboxId: string, path: string, body: string): Promise<void> {
  const res = await fetch(`${base}/sandboxes/${sandboxId}/files?path=${encodeURIComponent(path)}`, {
    method: "PUT",
    headers: { "content-type": "application/octet-stream" },
    body,
  });
  if (res.status !== 200) throw new Error(`writing ${path} into ${sandboxId}: ${res.status} ${await res.text()}`);
}
