/**
 * The SDK's one HTTP client: base URL and API key from options or BOTHY_URL / BOTHY_API_KEY, the
 * global `fetch`, problem+json answers turned into typed errors, an AbortSignal on every call and
 * responses checked with the protocol's zod schemas.
 */
import type { z } from "zod";
import { ConnectionError, errorFromProblem, SandboxError } from "./errors.ts";

/** What `fetch` accepts as a request body. */
export type RequestBody = NonNullable<RequestInit["body"]>;

export const DEFAULT_BASE_URL = "http://127.0.0.1:8080";

export interface ConnectionOptions {
  /** Where bothy serves its API; default BOTHY_URL, else http://127.0.0.1:8080. */
  baseUrl?: string;
  /** Sent as `Authorization: Bearer KEY`; default BOTHY_API_KEY. */
  apiKey?: string;
  /** Gives up on each HTTP request after this long (default 120 s; creates can boot a VM). */
  requestTimeoutMs?: number;
}

/** Options every call takes. */
export interface CallOptions {
  signal?: AbortSignal;
}

export interface RequestOptions extends CallOptions {
  query?: Record<string, string | number | boolean | undefined>;
  body?: unknown;
  headers?: Record<string, string>;
  /** Sent as it is instead of `body` as JSON (bytes, a stream). */
  rawBody?: RequestBody;
  /** false: no deadline, for streams the caller paces (uploads, downloads). */
  timeout?: boolean;
}

function env(name: string): string | undefined {
  const value = typeof process === "undefined" ? undefined : process.env[name];
  return value === undefined || value === "" ? undefined : value;
}

export class HttpClient {
  readonly baseUrl: string;
  private readonly apiKey: string | undefined;
  private readonly timeoutMs: number;

  constructor(options: ConnectionOptions = {}) {
    this.baseUrl = (options.baseUrl ?? env("BOTHY_URL") ?? DEFAULT_BASE_URL).replace(/\/+$/, "");
    this.apiKey = options.apiKey ?? env("BOTHY_API_KEY");
    this.timeoutMs = options.requestTimeoutMs ?? 120_000;
  }

  /** The options that reach the same server, for handing to another object. */
  get connection(): ConnectionOptions {
    return {
      baseUrl: this.baseUrl,
      ...(this.apiKey === undefined ? {} : { apiKey: this.apiKey }),
      requestTimeoutMs: this.timeoutMs,
    };
  }

  authHeaders(): Record<string, string> {
    return this.apiKey === undefined ? {} : { authorization: `Bearer ${this.apiKey}` };
  }

  url(path: string, query?: RequestOptions["query"]): string {
    const url = new URL(`${this.baseUrl}${path}`);
    for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) url.searchParams.set(k, String(v));
    return url.toString();
  }

  wsUrl(path: string): string {
    return this.url(path).replace(/^http/, "ws");
  }

  /**
   * Sends a request and answers the Response when it is 2xx; anything else becomes a typed error.
   * `body` is sent as JSON unless it is already a RequestBody (bytes, a stream, a string with its
   * own content-type header).
   */
  async fetch(method: string, path: string, options: RequestOptions = {}): Promise<Response> {
    const headers: Record<string, string> = { ...this.authHeaders(), ...options.headers };
    let body: RequestBody | undefined = options.rawBody;
    if (options.body !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(options.body);
    }
    // Streams (uploads, downloads) are paced by the caller, so only plain requests get a deadline.
    const signals = [
      options.signal,
      options.timeout === false ? undefined : AbortSignal.timeout(this.timeoutMs),
    ].filter((s): s is AbortSignal => s !== undefined);
    const signal = signals.length > 1 ? AbortSignal.any(signals) : signals[0];
    const url = this.url(path, options.query);
    let res: Response;
    try {
      res = await fetch(url, {
        method,
        headers,
        body,
        signal,
        // Needed by Node's fetch to send a stream as the body.
        ...(body instanceof ReadableStream ? { duplex: "half" } : {}),
      } as RequestInit);
    } catch (err) {
      if (options.signal?.aborted) throw options.signal.reason;
      if (err instanceof DOMException && err.name === "TimeoutError") {
        throw new SandboxError(`${method} ${path} got no answer within ${this.timeoutMs / 1000} s.`, {
          code: "request_timeout",
          cause: err,
        });
      }
      throw new ConnectionError(
        `Cannot reach bothy at ${this.baseUrl} (${describe(err)}); is \`bothy serve\` running there? Set BOTHY_URL or baseUrl to its address.`,
        { code: "connection_failed", cause: err },
      );
    }
    if (!res.ok) throw errorFromProblem(res.status, await res.text());
    return res;
  }

  /** A JSON request whose answer is checked against `schema`. */
  async json<S extends z.ZodType>(
    method: string,
    path: string,
    schema: S,
    options: RequestOptions = {},
  ): Promise<z.output<S>> {
    const res = await this.fetch(method, path, options);
    const text = await res.text();
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch (err) {
      throw new SandboxError(
        `${method} ${path} answered something that is not JSON; is BOTHY_URL (${this.baseUrl}) a bothy server?`,
        { code: "bad_response", cause: err },
      );
    }
    const parsed = schema.safeParse(json);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      throw new SandboxError(
        `${method} ${path} answered an unexpected shape (${issue?.path.join(".") ?? ""}: ${issue?.message ?? "invalid"}); the server may be newer or older than this SDK.`,
        { code: "bad_response", cause: parsed.error },
      );
    }
    return parsed.data;
  }
}

function describe(err: unknown): string {
  const cause = err instanceof Error && err.cause instanceof Error ? err.cause : err;
  if (cause instanceof Error) return "code" in cause && typeof cause.code === "string" ? cause.code : cause.message;
  return String(cause);
}
