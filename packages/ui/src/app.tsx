/**
 * The dashboard's shell: who is signed in (GET /ui/session on load), the navigation, and the page
 * the hash names. Each page is one file in pages/; adding one is a line in PAGES.
 */
import type { UiSessionInfo } from "@bothy/protocol";
import type { ComponentType } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, getJson, sendJson, useSession } from "./api.ts";
import { closeEvents } from "./events.ts";
import { ApprovalsPage } from "./pages/approvals.tsx";
import { KeysPage } from "./pages/keys.tsx";
import { MetricsPage } from "./pages/metrics.tsx";
import { PolicyPage } from "./pages/policy.tsx";
import { SandboxPage } from "./pages/sandbox.tsx";
import { SandboxesPage } from "./pages/sandboxes.tsx";
import { SecretsPage } from "./pages/secrets.tsx";
import { SignInPage } from "./pages/sign-in.tsx";
import { TenantsPage } from "./pages/tenants.tsx";
import { UsagePage } from "./pages/usage.tsx";
import { href, useRoute, type Route } from "./router.ts";
import { signIn, takeLinkToken } from "./sign-in-flow.ts";
import { canOf, type Can } from "./scopes.ts";

export interface PageProps {
  route: Route;
  session: UiSessionInfo;
  can: Can;
}

/** `needs`: the scope without which the page is neither in the navigation nor shown (its calls would fail). */
const PAGES: Record<
  string,
  { title: string; page: ComponentType<PageProps>; nav?: boolean; needs?: UiSessionInfo["scopes"][number] }
> = {
  sandboxes: { title: "Sandboxes", page: SandboxesPage, nav: true },
  sandbox: { title: "Sandbox", page: SandboxPage },
  approvals: { title: "Approvals", page: ApprovalsPage, nav: true },
  keys: { title: "Keys", page: KeysPage, nav: true, needs: "keys:manage" },
  secrets: { title: "Secrets", page: SecretsPage, nav: true, needs: "secrets" },
  policy: { title: "Policy", page: PolicyPage, nav: true },
  usage: { title: "Usage", page: UsagePage, nav: true, needs: "sandboxes:read" },
  tenants: { title: "Tenants", page: TenantsPage, nav: true, needs: "admin" },
  metrics: { title: "Metrics", page: MetricsPage, nav: true, needs: "admin" },
};

export function App() {
  // Taken before the route is read, so the link's token is never a route nor left in the address bar.
  const [token] = useState(takeLinkToken);
  const route = useRoute();
  const [session, setSession] = useState<UiSessionInfo | null | undefined>(undefined);
  const [linkError, setLinkError] = useState<string | null>(null);
  /** The navigation on a narrow screen: folded behind its button until opened, folded again on every page change. */
  const [menuOpen, setMenuOpen] = useState(false);
  const menuButton = useRef<HTMLButtonElement>(null);
  useEffect(() => setMenuOpen(false), [route.page]);
  // Escape folds the open menu and gives focus back to its button, as a disclosure's keyboard users expect.
  useEffect(() => {
    if (!menuOpen) return;
    const onKey = (ev: KeyboardEvent): void => {
      if (ev.key !== "Escape") return;
      setMenuOpen(false);
      menuButton.current?.focus();
    };
    document.addEventListener("keydown", onKey);
    return () => document.removeEventListener("keydown", onKey);
  }, [menuOpen]);
  useEffect(() => {
    // Opened from a sign-in link: its token becomes the session (once); else the cookie's session, if any.
    const start = token === undefined ? getJson<UiSessionInfo>("/ui/session") : signIn({ link: token });
    start
      .then((s) => {
        useSession(s);
        setSession(s);
      })
      .catch((err: unknown) => {
        if (token !== undefined) setLinkError(err instanceof ApiError ? err.message : String(err));
        else if (!(err instanceof ApiError) || err.status !== 401) console.warn(err);
        setSession(null);
      });
  }, [token]);

  const can = session ? canOf(session) : () => false;
  const allowed = (p: (typeof PAGES)[string]): boolean => p.needs === undefined || can(p.needs);
  const named = PAGES[route.page];
  const entry = named && allowed(named) ? named : PAGES["sandboxes"]!;
  useTitle(session ? entry.title : "Sign in");
  if (session === undefined) return <main class="loading">Loading…</main>;
  if (session === null)
    return (
      <SignInPage
        initialError={linkError}
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
        <button
          type="button"
          ref={menuButton}
          class="quiet menu-toggle"
          aria-expanded={menuOpen}
          aria-controls="main-nav"
          onClick={() => setMenuOpen(!menuOpen)}
        >
          Menu
        </button>
        <nav aria-label="Main" id="main-nav" class={menuOpen ? "open" : undefined}>
          {Object.entries(PAGES)
            .filter(([, p]) => p.nav && allowed(p))
            .map(([name, p]) => (
              <a
                key={name}
                href={href(name)}
                aria-current={route.page === name ? "page" : undefined}
                // The page's own link changes no route, so the menu is folded by the click itself.
                onClick={() => setMenuOpen(false)}
              >
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
        <Page route={route} session={session} can={can} />
      </main>
    </>
  );
}

function useTitle(title: string): void {
  useEffect(() => {
    document.title = `${title} · bothy`;
  }, [title]);
}
