/**
 * Turning a key or a sign-in link into a session (POST /ui/session), and checking that the
 * browser kept the cookie: behind a TLS proxy the server sets it Secure, which a browser on
 * plain HTTP drops, and the page would otherwise look signed in while every call fails.
 */
import type { UiSessionInfo } from "@bothy/protocol";
import { ApiError, getJson, sendJson, useSession } from "./api.ts";

const LINK_RE = /^#link=([A-Za-z0-9_-]{43})$/;

/**
 * The token of a sign-in link this page was opened with (`/ui/#link=TOKEN`), if any. It is taken
 * out of the address bar and the history at once, so a reload or a shared screen shows it no more.
 */
export function takeLinkToken(): string | undefined {
  const token = LINK_RE.exec(location.hash)?.[1];
  if (token !== undefined) history.replaceState(null, "", `${location.pathname}#/sandboxes`);
  return token;
}

export async function signIn(body: { key: string } | { link: string }): Promise<UiSessionInfo> {
  const session = await sendJson<UiSessionInfo>("POST", "/ui/session", body);
  useSession(session);
  try {
    await getJson<UiSessionInfo>("/ui/session");
  } catch (err) {
    useSession(null);
    if (err instanceof ApiError && err.status === 401)
      throw new ApiError(
        "Signed in, but this browser did not keep the session cookie: the server sets it Secure (it expects HTTPS from a proxy in front); open the dashboard over HTTPS.",
        "unauthorized",
        401,
      );
    throw err;
  }
  return session;
}
