/**
 * Sign-in: an API key pasted once becomes a session cookie the page cannot read (POST /ui/session).
 * A refused sign-in link (`bothy ui-link`) arrives here with the server's words in `initialError`.
 */
import type { UiSessionInfo } from "@bothy/protocol";
import { useState } from "preact/hooks";
import { ApiError } from "../api.ts";
import { signIn } from "../sign-in-flow.ts";

export function SignInPage({
  onSignedIn,
  initialError = null,
}: {
  onSignedIn: (session: UiSessionInfo) => void;
  initialError?: string | null;
}) {
  const [key, setKey] = useState("");
  const [error, setError] = useState<string | null>(initialError);
  const [busy, setBusy] = useState(false);
  const submit = async (ev: Event): Promise<void> => {
    ev.preventDefault();
    setBusy(true);
    setError(null);
    try {
      onSignedIn(await signIn({ key: key.trim() }));
    } catch (err) {
      setError(err instanceof ApiError ? err.message : String(err));
    } finally {
      setBusy(false);
      setKey("");
    }
  };
  return (
    <main class="sign-in">
      <h1>Sign in to bothy</h1>
      <form onSubmit={(ev) => void submit(ev)}>
        <label for="key">API key</label>
        <input
          id="key"
          name="key"
          type="password"
          autocomplete="off"
          placeholder="bothy_…"
          value={key}
          onInput={(ev) => setKey((ev.target as HTMLInputElement).value)}
          required
        />
        <p class="hint">
          The first start wrote an admin key to <code>$BOTHY_HOME/admin.key</code>. The key stays on this page only
          until you sign in: the browser then holds a session it cannot read.
        </p>
        <button type="submit" disabled={busy}>
          Sign in
        </button>
        {error !== null && (
          <p role="alert" class="error">
            {error}
          </p>
        )}
      </form>
    </main>
  );
}
