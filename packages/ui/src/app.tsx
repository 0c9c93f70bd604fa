/**
 * The dashboard's shell: who is signed in (GET /ui/session on load), the navigation, and the page
 * the hash names. Each page is one file in pages/; adding one is a line in PAGES.
 */
import type { UiSessionInfo } from "@bothy/protocol";
import type { ComponentType } from "preact";
import { useEffect, useState } from "preact/hooks";
import { ApiError, getJson, sendJson, useSession } from "./api.ts";
import { closeEvents } from "./events.ts";
import { ApprovalsPage } from "./pages/approvals.tsx";
import { SandboxPage } from "./pages/sandbox.tsx";
import { SandboxesPage } from "./pages/sandboxes.tsx";
import { SignInPage } from "./pages/sign-in.tsx";
import { href, useRoute, type Route } from "./router.ts";
import { canOf, type Can } from "./scopes.ts";

export interface PageProps {
  route: Route;
  session: UiSessionInfo;
  can: Can;
}

const PAGES: Record<string, { title: string; page: ComponentType<PageProps>; nav?: boolean }> = {
  sandboxes: { title: "Sandboxes", page: SandboxesPage, nav: true },
  sandbox: { title: "Sandbox", page: SandboxPage },
  approvals: { title: "Approvals", page: ApprovalsPage, nav: true },
};

export function App() {
  const route = useRoute();
  const [session, setSession] = useState<UiSessionInfo | null | undefined>(undefined);
  useEffect(() => {
    getJson<UiSessionInfo>("/ui/session")
      .then((s) => {
        useSession(s);
        setSession(s);
      })
      .catch((err: unknown) => {
        if (!(err instanceof ApiError) || err.status !== 401) console.warn(err);
        setSession(null);
      });
  }, []);

  const entry = PAGES[route.page] ?? PAGES["sandboxes"]!;
  useTitle(session ? entry.title : "Sign in");
  if (session === undefined) return <main class="loading">Loading…</main>;
  if (session === null)
    return (
      <SignInPage
        onSignedIn={(s) => {
          useSession(s);
          setSession(s);
        }}
      />
    );

  const Page = entry.page;
  const signOut = async (): Promise<void> => {
    await sendJson("DELETE", "/ui/session").catch((err: unknown) => console.warn(err));
    closeEvents();
    useSession(null);
    setSession(null);
  };
  return (
    <>
      <header class="top">
        <a class="brand" href={href("sandboxes")}>
          bothy
        </a>
        <nav aria-label="Main">
          {Object.entries(PAGES)
            .filter(([, p]) => p.nav)
            .map(([name, p]) => (
              <a key={name} href={href(name)} aria-current={route.page === name ? "page" : undefined}>
                {p.title}
              </a>
            ))}
        </nav>
        <span class="who">
          {session.tenant} · {session.key_id ?? "no auth"}
        </span>
        {session.csrf_token !== null && (
          <button type="button" class="quiet" onClick={() => void signOut()}>
            Sign out
          </button>
        )}
      </header>
      <main>
        <Page route={route} session={session} can={canOf(session)} />
      </main>
    </>
  );
}

function useTitle(title: string): void {
  useEffect(() => {
    document.title = `${title} · bothy`;
  }, [title]);
}
