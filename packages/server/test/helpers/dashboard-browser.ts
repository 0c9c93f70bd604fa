/**
 * What the dashboard's browser tests share: the host's Chromium, headless, with the API's test
 * name (and its preview hosts) mapped to the address the server listens on; axe-core on a page;
 * signing in with a key; and a page that records console errors.
 */
import { existsSync } from "node:fs";
import { mkdir, readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { chromium, type Browser, type Page } from "playwright-core";
import { UI_DIST } from "../../src/api/ui-routes.ts";

export const CHROMIUM = "/usr/bin/chromium";
const AXE = fileURLToPath(new URL("../../../../node_modules/axe-core/axe.min.js", import.meta.url));
/** Screenshots of each page, kept as test artifacts (gitignored). */
export const ARTIFACTS = fileURLToPath(new URL("../../../../test-artifacts/dashboard/", import.meta.url));
/** The API by a name of its own, as a real deployment would have. */
export const API_HOST = "bothy.test";

/** What the dashboard's browser tests need that this machine may lack, or undefined. */
export function dashboardMissing(): string | undefined {
  if (!existsSync(CHROMIUM)) return `Chromium at ${CHROMIUM}`;
  if (!existsSync(`${UI_DIST}index.html`)) return "the built dashboard (npm run build)";
  return undefined;
}

/** Chromium with API_HOST and its subdomains resolving to `address` (where the server listens). */
export async function launchDashboardBrowser(address: string): Promise<Browser> {
  await mkdir(ARTIFACTS, { recursive: true });
  return chromium.launch({
    executablePath: CHROMIUM,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-quic",
      "--no-first-run",
      "--disable-sync",
      `--host-resolver-rules=MAP ${API_HOST} ${address}, MAP *.${API_HOST} ${address}`,
    ],
  });
}

/** Collects a page's errors: uncaught ones and console errors other than failed loads (a refused key's 401). */
export function recordErrors(page: Page, errors: string[]): void {
  page.on("pageerror", (err) => errors.push(String(err)));
  page.on("console", (msg) => {
    if (msg.type() === "error" && !msg.text().startsWith("Failed to load resource")) errors.push(msg.text());
  });
}

/** axe-core's serious and critical violations on the page as it is now. */
export async function accessibilityViolations(page: Page): Promise<string[]> {
  // Evaluated through the DevTools protocol, which the page's CSP does not govern.
  await page.evaluate(await readFile(AXE, "utf8"));
  const found = await page.evaluate<Array<{ id: string; impact: string | null; help: string; nodes: unknown[] }>>(
    `axe.run(document, { resultTypes: ["violations"] }).then((r) => r.violations)`,
  );
  return found
    .filter((v) => v.impact === "serious" || v.impact === "critical")
    .map((v) => `${v.id} (${v.impact}): ${v.help} x${v.nodes.length}`);
}

/** Signs the page in at `ui` with `key` from the sign-in form and waits for the sandbox list. */
export async function signIn(page: Page, ui: string, key: string): Promise<void> {
  await page.goto(`${ui}/ui/`);
  await page.getByLabel("API key").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Sandboxes" }).waitFor();
}
