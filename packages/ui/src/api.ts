/**
 * The dashboard's one way to the API: same-origin requests that the session cookie authenticates
 * (the page never sees a key after sign-in), with the session's CSRF token on every
 * state-changing one, and problem+json answers turned into errors that carry the server's words.
 */
import type { UiSessionInfo } from "@bothy/protocol";

export class ApiError extends Error {
  constructor(
    message: string,
    readonly code: string,
    readonly status: number,
  ) {
    super(message);
  }
}

let csrf: string | null = null;

/** Called once the session is known (sign-in, or GET /ui/session on load). */
export function useSession(session: UiSessionInfo | null): void {
  csrf = session?.csrf_token ?? null;
}

/** The headers a request the cookie authenticates carries (for an XMLHttpRequest, which `call` is not). */
export function sessionHeaders(): Record<string, string> {
  return { "x-csrf-token": csrf ?? "fetch" };
}

async function failure(res: Response): Promise<ApiError> {
  return problemOf(await res.text(), res.status, res.statusText);
}

/** A problem+json body as an ApiError; any other body keeps the status line. */
export function problemOf(text: string, status: number, statusText: string): ApiError {
  try {
    const problem = JSON.parse(text) as { detail?: string; code?: string };
    return new ApiError(problem.detail ?? statusText, problem.code ?? "unknown", status);
  } catch {
    // Not problem+json (a proxy in front, say): keep the status line.
    return new ApiError(`${status} ${statusText}`, "unknown", status);
  }
}

/** A request to the API; JSON bodies are sent as JSON, anything else (a File) as bytes. */
export async function call(method: string, path: string, body?: unknown): Promise<Response> {
  // Every request the cookie authenticates carries the token (auth/session-auth.ts); before the
  // session is known, only GET /ui/session is asked, which takes any value.
  const headers = sessionHeaders();
  let payload: BodyInit | undefined;
  if (body instanceof Blob) {
    payload = body;
    headers["content-type"] = "application/octet-stream";
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers["content-type"] = "application/json";
  }
  const res = await fetch(path, { method, headers, body: payload ?? null, credentials: "same-origin" });
  if (!res.ok) throw await failure(res);
  return res;
}

export async function getJson<T>(path: string): Promise<T> {
  return (await (await call("GET", path)).json()) as T;
}

export async function sendJson<T>(method: string, path: string, body?: unknown): Promise<T> {
  const res = await call(method, path, body);
  return (res.status === 204 ? undefined : await res.json()) as T;
}

/** Saves an API answer as a file: fetched with the token (a plain link could not send it), then handed to the browser. */
export async function download(path: string, name: string): Promise<void> {
  const blob = await (await call("GET", path)).blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

/** The ws:/wss: URL of an API path on this origin (the cookie goes along with the upgrade). */
export function wsUrl(path: string): string {
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${path}`;
}
