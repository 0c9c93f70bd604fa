/**
 * Pages by the URL's hash (`#/sandboxes/ID`), so the server serves one index.html and a reload
 * keeps the page. A new page is one entry in ROUTES (app.tsx) and one file in pages/.
 */
import { useEffect, useState } from "preact/hooks";

export interface Route {
  /** The hash path's first part: "sandboxes", "approvals". */
  page: string;
  /** What follows it, e.g. a sandbox id. */
  rest: string[];
}

export function parseHash(hash: string): Route {
  const [page = "sandboxes", ...rest] = hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  return { page, rest };
}

export function href(...parts: string[]): string {
  return `#/${parts.map(encodeURIComponent).join("/")}`;
}

export function useRoute(): Route {
  const [route, setRoute] = useState(() => parseHash(location.hash));
  useEffect(() => {
    const onChange = (): void => setRoute(parseHash(location.hash));
    addEventListener("hashchange", onChange);
    // The hash may have changed between the first render and this listener (a link followed while
    // the page loads): read it once more.
    onChange();
    return () => removeEventListener("hashchange", onChange);
  }, []);
  return route;
}
