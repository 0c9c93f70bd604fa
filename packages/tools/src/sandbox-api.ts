/**
 * A small client for the parts of bothy's sandbox API the tools use: create/show/delete, one
 * command over the command WebSocket, and the files API. The tools run on top of the public API
 * (over loopback inside the server), so the same code works against any bothy server.
 */
import { Readable } from "node:stream";
import WebSocket from "ws";
import { z } from "zod";
import {
  BothyError,
  bothyEvent,
  commandEvent,
  fileStat,
  isErrorCode,
  sandboxInfo,
  type SandboxInfo,
} from "@bothy/protocol";

export type FileStat = z.infer<typeof fileStat>;

export interface CreateOptions {
  template: string;
  vcpu?: number;
  memory_mib?: number;
  timeout_s?: number;
  internet?: boolean;
}

export interface ExecRequest {
  cmd: string;
  cwd?: string;
  timeout_s?: number;
  background?: boolean;
}

export interface ExecResult {
  command_id: string;
  exit_code: number | null;
  signal?: string | undefined;
  timed_out?: boolean | undefined;
}

const writeAnswer = z.object({ path: z.string(), size: z.number().int(), sha256: z.string() });

/** Turns a problem+json answer into the BothyError it describes. */
async function problem(res: Response, what: string): Promise<BothyError> {
  const text = await res.text().catch(() => "");
  try {
    const body = JSON.parse(text) as { code?: unknown; detail?: unknown };
    if (isErrorCode(body.code))
      return new BothyError(body.code, typeof body.detail === "string" ? body.detail : `${what} failed`);
  } catch {
    // not JSON: fall through to a generic error that names the status
  }
  return new BothyError("internal", `${what} answered HTTP ${res.status}.`);
}

export class SandboxApi {
  constructor(private readonly base: () => string) {}

  private url(path: string, query?: Record<string, string>): string {
    return `${this.base()}${path}${query ? `?${new URLSearchParams(query).toString()}` : ""}`;
  }

  private async call(
    method: string,
    path: string,
    options: {
      query?: Record<string, string>;
      json?: unknown;
      body?: RequestInit["body"];
      headers?: Record<string, string>;
      signal?: AbortSignal;
    } = {},
  ): Promise<Response> {
    const headers: Record<string, string> = { ...options.headers };
    if (options.json !== undefined) headers["content-type"] = "application/json";
    const res = await fetch(this.url(path, options.query), {
      method,
      headers,
      body: options.json !== undefined ? JSON.stringify(options.json) : options.body,
      ...(options.body instanceof ReadableStream ? { duplex: "half" } : {}),
      ...(options.signal ? { signal: options.signal } : {}),
    });
    if (!res.ok) throw await problem(res, `${method} ${path}`);
    return res;
  }

  async create(options: CreateOptions): Promise<SandboxInfo> {
    return sandboxInfo.parse(await (await this.call("POST", "/sandboxes", { json: options })).json());
  }

  /** The sandbox, or undefined when the server does not know it. */
  async get(id: string): Promise<SandboxInfo | undefined> {
    try {
      return sandboxInfo.parse(await (await this.call("GET", `/sandboxes/${id}`)).json());
    } catch (err) {
      if (err instanceof BothyError && (err.code === "sandbox_not_found" || err.code === "invalid_sandbox_id"))
        return undefined;
      throw err;
    }
  }

  async delete(id: string): Promise<void> {
    await this.call("DELETE", `/sandboxes/${id}`);
  }

  /**
   * Waits for a background command to end, on the server's event stream (replayed from the start
   * for this sandbox, so an end that came first is not missed). Undefined when the sandbox is
   * deleted first, the stream ends, or `signal` aborts.
   */
  async waitForCommand(
    sandboxId: string,
    commandId: string,
    signal: AbortSignal,
  ): Promise<{ exit_code: number | null; signal: string | null } | undefined> {
    const res = await fetch(this.url("/events", { sandbox_id: sandboxId, since: "0" }), { signal }).catch(
      () => undefined,
    );
    if (!res?.ok || !res.body) return undefined;
    const decoder = new TextDecoder();
    let buffered = "";
    try {
      for await (const chunk of res.body) {
        buffered += decoder.decode(chunk as Uint8Array, { stream: true });
        let end: number;
        while ((end = buffered.indexOf("\n\n")) >= 0) {
          const data = buffered
            .slice(0, end)
            .split("\n")
            .find((l) => l.startsWith("data: "));
          buffered = buffered.slice(end + 2);
          if (!data) continue;
          const ev = bothyEvent.safeParse(JSON.parse(data.slice(6)));
          if (!ev.success) continue;
          if (ev.data.type === "sandbox.deleted") return undefined;
          const d = ev.data.data as { command_id?: unknown; exit_code?: unknown; signal?: unknown };
          if (ev.data.type === "command.exited" && d.command_id === commandId) {
            return {
              exit_code: typeof d.exit_code === "number" ? d.exit_code : null,
              signal: typeof d.signal === "string" ? d.signal : null,
            };
          }
        }
      }
    } catch {
      // aborted, or the server went away
    }
    return undefined;
  }

  /**
   * Runs one command and streams its output to `onOutput`. A background command answers once
   * it has started; the socket then closes cleanly and the command keeps running.
   */
  exec(
    id: string,
    request: ExecRequest,
    onOutput: (stream: "stdout" | "stderr", text: string) => void,
    signal?: AbortSignal,
  ): Promise<ExecResult> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(`${this.base().replace(/^http/, "ws")}/sandboxes/${id}/command`);
      let commandId = "";
      let settled = false;
      const decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
      const finish = (err: Error | undefined, result?: ExecResult): void => {
        if (settled) return;
        settled = true;
        signal?.removeEventListener("abort", onAbort);
        if (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING) ws.close(1000);
        if (err) reject(err);
        else if (result) resolve(result);
      };
      // A cancelled tool call kills a foreground command: closing the socket does that.
      const onAbort = (): void =>
        finish(new BothyError("invalid_request", "The tool call was cancelled; the command was killed."));
      signal?.addEventListener("abort", onAbort);
      ws.on("open", () => ws.send(JSON.stringify(request)));
      ws.on("message", (data) => {
        const ev = commandEvent.parse(JSON.parse(String(data)));
        if (ev.type === "started") {
          commandId = ev.command_id;
          if (request.background) finish(undefined, { command_id: commandId, exit_code: null });
        } else if (ev.type === "stdout" || ev.type === "stderr") {
          const bytes = ev.encoding === "base64" ? Buffer.from(ev.data, "base64") : Buffer.from(ev.data, "utf8");
          onOutput(ev.type, decoders[ev.type].decode(bytes, { stream: true }));
        } else if (ev.type === "process_exited") {
          finish(undefined, {
            command_id: commandId,
            exit_code: ev.exit_code,
            signal: ev.signal,
            timed_out: ev.timed_out,
          });
        } else if (ev.type === "error") {
          finish(new BothyError(isErrorCode(ev.code) ? ev.code : "internal", ev.message));
        }
      });
      ws.on("unexpected-response", (_req, res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          let err = new BothyError("internal", `The command socket was refused (HTTP ${res.statusCode}).`);
          try {
            const body = JSON.parse(Buffer.concat(chunks).toString()) as { code?: unknown; detail?: unknown };
            if (isErrorCode(body.code)) err = new BothyError(body.code, String(body.detail));
          } catch {
            // keep the generic error
          }
          finish(err);
        });
      });
      ws.on("error", (err) => finish(new BothyError("agent_unavailable", `The command socket failed: ${err.message}`)));
      ws.on("close", () =>
        finish(new BothyError("agent_unavailable", "The command socket closed before the command ended.")),
      );
    });
  }

  /** The file's bytes as a stream (throws file_not_found and friends as BothyError). */
  /** A small file whole (the tools' own scratch files: extracted text, a downscaled image). */
  async readAll(id: string, path: string): Promise<Buffer> {
    const chunks: Buffer[] = [];
    for await (const chunk of await this.readStream(id, path)) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks);
  }

  async readStream(id: string, path: string, signal?: AbortSignal): Promise<Readable> {
    const res = await this.call("GET", `/sandboxes/${id}/files`, { query: { path }, ...(signal ? { signal } : {}) });
    if (!res.body) return Readable.from([]);
    return Readable.fromWeb(res.body as import("node:stream/web").ReadableStream<Uint8Array>);
  }

  async stat(id: string, path: string, sha256 = false): Promise<FileStat> {
    const res = await this.call("GET", `/sandboxes/${id}/files/stat`, {
      query: { path, ...(sha256 ? { sha256: "true" } : {}) },
    });
    return fileStat.parse(await res.json());
  }

  /** Replaces the file atomically; with `ifMatch`, only if its sha256 is still that (else precondition_failed). */
  async write(
    id: string,
    path: string,
    body: Buffer | Readable,
    ifMatch?: string,
  ): Promise<{ size: number; sha256: string }> {
    const payload: RequestInit["body"] = Buffer.isBuffer(body)
      ? new Uint8Array(body)
      : (Readable.toWeb(body) as ReadableStream<Uint8Array>);
    const res = await this.call("PUT", `/sandboxes/${id}/files`, {
      query: { path },
      body: payload,
      headers: { "content-type": "application/octet-stream", ...(ifMatch ? { "if-match": `"${ifMatch}"` } : {}) },
    });
    return writeAnswer.parse(await res.json());
  }

  /** Makes a directory and its parents; an existing one is fine. */
  async mkdirp(id: string, path: string): Promise<void> {
    try {
      await this.call("POST", `/sandboxes/${id}/files/mkdir`, { json: { path, parents: true } });
    } catch (err) {
      if (!(err instanceof BothyError && err.code === "file_exists")) throw err;
    }
  }
}
