/**
 * The dashboard's admin pages in the host's Chromium, against one real server and no sandbox:
 * tenants and quotas, secrets (values write-only: never read back, never left in the page, never
 * in the log), the tenant's default host policy, usage against the budget (rows metered into the
 * ledger, as the meter would), and /metrics at a glance. Then every page at a desktop's and a
 * phone's size (nothing wider than the screen, the navigation folded on the phone), by keyboard
 * alone (every control reached by Tab, each with a visible focus ring), with no serious
 * accessibility violation and no console error; and a read-only key sees no button that would fail.
 */
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { api } from "./helpers/client.ts";
import {
  accessibilityViolations,
  API_HOST,
  ARTIFACTS,
  dashboardMissing,
  launchDashboardBrowser,
  recordErrors,
  signIn,
} from "./helpers/dashboard-browser.ts";
import { useTestServer } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

const missing = dashboardMissing();
const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 375, height: 812 };
/** Every page that needs no sandbox: its address, its heading, and what shows once its data is in. */
const PAGES: ReadonlyArray<[string, string, string]> = [
  ["sandboxes", "Sandboxes", ".count:not(:empty)"],
  ["approvals", "Approvals", "p.empty"],
  ["keys", "Keys", "tr[data-key]"],
  ["secrets", "Secrets", "p.empty, tr[data-secret]"],
  ["policy", "Host policy", "#policy-tenant"],
  ["usage", "Usage", "tr[data-owner]"],
  ["tenants", "Tenants", "tr[data-tenant]"],
  ["metrics", "Metrics", "[data-figure]"],
];

/**
 * Usage as the meter records it (UsageMeter.tick): `hours` vCPU hours and as many GiB hours for
 * `owner` on each of `days` (UTC days, `2026-12-03`). The one place this test writes the ledger.
 */
async function meter(ts: TestServer, owner: string, days: string[], hours: number): Promise<void> {
  await ts.server.ledger.addUsage(
    days.map((day) => ({
      sandboxId: `sbx_${owner.padEnd(20, "a").slice(0, 20)}`,
      owner,
      month: day.slice(0, 7),
      day,
      vcpuSeconds: hours * 3600,
      gibSeconds: hours * 3600,
    })),
  );
}

/**
 * Run in the page (a string: this package's types have no DOM): elements that reach past the
 * viewport's right edge, other than inside a box that scrolls or clips sideways (a wide table
 * scrolls within its own box), described for the failure message.
 */
const OVERFLOWING = `(() => {
  const width = document.documentElement.clientWidth;
  const out = [];
  if (document.documentElement.scrollWidth > width)
    out.push("the page scrolls sideways: " + document.documentElement.scrollWidth + " > " + width);
  const clipped = (el) => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement)
      if (["auto", "scroll", "hidden"].includes(getComputedStyle(p).overflowX)) return true;
    return false;
  };
  for (const el of document.body.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || clipped(el)) continue;
    if (r.right > width + 0.5 || r.left < -0.5)
      out.push(el.tagName.toLowerCase() + "." + el.className + " " + Math.round(r.left) + ".." + Math.round(r.right));
  }
  return out;
})()`;

const overflowing = (page: Page): Promise<string[]> => page.evaluate<string[]>(OVERFLOWING);

/** Run in the page: numbers every control it shows (data-tab) and answers how many there are. */
const NUMBER_CONTROLS = `(() => {
  const all = document.querySelectorAll(
    "a[href], button:not([disabled]), input:not([disabled]), select:not([disabled]), textarea:not([disabled]), summary, [tabindex='0']",
  );
  const shown = [...all].filter((el) => el.getClientRects().length > 0 && !el.closest("fieldset[disabled]"));
  shown.forEach((el, i) => (el.dataset.tab = String(i)));
  return shown.length;
})()`;

/** Run in the page: the focused control's number and whether its focus ring shows (an outline of 2px or more). */
const FOCUSED = `(() => {
  const el = document.activeElement;
  if (!el || el === document.body) return null;
  const style = getComputedStyle(el);
  return {
    tab: el.dataset.tab ?? "unnumbered " + el.outerHTML.slice(0, 80),
    ring: style.outlineStyle !== "none" && parseFloat(style.outlineWidth) >= 2,
  };
})()`;

/** Run in the page: everything it keeps that a value could hide in (markup, fields, storage). */
const KEPT = `JSON.stringify({
  html: document.documentElement.outerHTML,
  inputs: [...document.querySelectorAll("input, textarea")].map((i) => i.value),
  storage: [{ ...localStorage }, { ...sessionStorage }],
})`;

describe.skipIf(missing !== undefined)(`the dashboard's admin pages${missing ? ` (needs ${missing})` : ""}`, () => {
  let ts: TestServer;
  let ui: string;
  let browser: Browser;
  let context: BrowserContext;
  let page: Page;
  const errors: string[] = [];
  /** Every answer body the admin's browser received, to show no secret value ever came back. */
  const answers: string[] = [];

  useTestServer({}, (server) => {
    ts = server;
    ui = `http://${API_HOST}:${new URL(server.url).port}`;
  });

  beforeAll(async () => {
    browser = await launchDashboardBrowser("127.0.0.1");
    context = await browser.newContext({ viewport: DESKTOP });
    page = await context.newPage();
    recordErrors(page, errors);
    page.on("response", (res) => {
      if (res.url().startsWith(ui) && !res.url().includes("/ui/assets/"))
        void res.text().then(
          (t) => answers.push(t),
          () => undefined,
        );
    });
    await signIn(page, ui, ts.apiKey);
  });

  afterAll(async () => {
    await browser?.close();
  });

  const open = async (name: string, heading: string, on: Page = page): Promise<void> => {
    await on.goto(`${ui}/ui/#/${name}`);
    await on.getByRole("heading", { name: heading, level: 1 }).waitFor();
  };
  const shot = (name: string, on: Page = page): Promise<Buffer> =>
    on.screenshot({ path: `${ARTIFACTS}${name}.png`, fullPage: true });
  const tenantRow = (t: string) => page.locator(`tr[data-tenant="${t}"]`);

  it("creates a tenant, shows its quotas beside its use, edits one and lifts one", async () => {
    await open("tenants", "Tenants");
    await tenantRow("default").waitFor();
    await page.getByLabel("New tenant").fill("acme");
    await page.getByRole("button", { name: "Create tenant" }).click();
    // A new tenant opens its quota form.
    const form = page.getByRole("form", { name: "Quotas of acme" });
    await form.getByLabel("Max sandboxes").fill("3");
    await form.getByLabel("Max vCPU").fill("8");
    await form.getByLabel("vCPU hours a month").fill("10");
    await form.getByLabel("GiB hours a month").fill("20");
    await form.getByRole("button", { name: "Save quotas" }).click();
    await expect.poll(() => tenantRow("acme").locator("td").nth(1).textContent()).toBe("0 / 3");
    expect((await api(ts.url, "GET", "/tenants/acme")).json["quota"]).toEqual({
      max_sandboxes: 3,
      max_vcpu: 8,
      monthly_vcpu_hours: 10,
      monthly_gib_hours: 20,
    });

    await page.getByRole("button", { name: "Edit quotas of acme" }).click();
    await form.getByLabel("Max vCPU").fill("");
    await form.getByRole("button", { name: "Save quotas" }).click();
    await expect.poll(() => tenantRow("acme").locator("td").nth(2).textContent()).toBe("0 / ∞");
    expect((await api(ts.url, "GET", "/tenants/acme")).json["quota"]).not.toHaveProperty("max_vcpu");

    // A name the API refuses: its words on the page, no 5xx.
    await page.getByLabel("New tenant").fill("acme");
    await page.getByRole("button", { name: "Create tenant" }).click();
    await expect.poll(() => page.getByRole("alert").textContent()).toContain("Tenant acme exists");
    expect(await accessibilityViolations(page)).toEqual([]);
    await shot("tenants");
  });

  it("stores, rotates and deletes a secret whose value is never read back, left in the page or logged", async () => {
    const first = `first-${randomBytes(12).toString("hex")}`;
    const second = `second-${randomBytes(12).toString("hex")}`;
    await open("secrets", "Secrets");
    await page.getByLabel("Name").fill("github");
    await page.getByLabel("Value").fill(first);
    await page.getByLabel("Hosts").fill("api.github.test *.githubusercontent.test");
    await page.getByLabel("Inject as header").fill("Authorization");
    await page.getByLabel("Header format").fill("Bearer {value}");
    await page.getByRole("button", { name: "Store secret" }).click();
    const row = page.locator('tr[data-secret="github"]');
    await row.waitFor();
    expect(await row.locator("td").nth(2).textContent()).toBe("api.github.test *.githubusercontent.test");
    expect(await row.locator("td").nth(3).textContent()).toBe("Authorization: Bearer {value}");
    const stored = (await api(ts.url, "GET", "/secrets/github")).json;
    expect(stored).toMatchObject({ tenant: "default", inject: { header: "Authorization", format: "Bearer {value}" } });
    expect(await page.getByLabel("Value").inputValue()).toBe("");

    // Rotate: the same name and hosts, a new value.
    await page.getByRole("button", { name: "Rotate github" }).click();
    expect(await page.getByLabel("Hosts").inputValue()).toBe("api.github.test *.githubusercontent.test");
    await page.getByLabel("Value").fill(second);
    await page.getByRole("button", { name: "Save new value of github" }).click();
    await page.getByText("Rotated github").waitFor();
    const rotated = (await api(ts.url, "GET", "/secrets/github")).json;
    expect(rotated["updated_at"]).not.toBe(stored["updated_at"]);
    expect(rotated["created_at"]).toBe(stored["created_at"]);

    // A refused value (no host) is also gone from the field, and the refusal does not echo it.
    await page.getByLabel("Name").fill("other");
    await page.getByLabel("Value").fill(first);
    await page.getByLabel("Hosts").fill("not a host!");
    await page.getByRole("button", { name: "Store secret" }).click();
    await expect.poll(() => page.getByRole("alert").textContent()).toContain("hosts");
    expect(await page.getByLabel("Value").inputValue()).toBe("");
    expect(await accessibilityViolations(page)).toEqual([]);
    await shot("secrets");

    // Neither value is anywhere the page keeps things, nor in any answer, nor in the server's log.
    const kept = await page.evaluate<string>(KEPT);
    for (const value of [first, second]) {
      expect(kept).not.toContain(value);
      expect(answers.join("\n")).not.toContain(value);
      expect(await readFile(ts.logPath, "utf8")).not.toContain(value);
    }

    await page.getByRole("button", { name: "Delete github" }).click();
    await row.waitFor({ state: "detached" });
    expect((await api(ts.url, "GET", "/secrets/github")).status).toBe(404);
  });

  it("edits the tenant's default host policy: rules with allow, deny and ask, lists and default", async () => {
    await open("policy", "Host policy");
    await page.locator('[data-policy="none"]').waitFor();
    await page.getByRole("button", { name: "Add rule" }).click();
    await page.getByLabel("Rule 1 host").fill("*.example.test");
    await page.getByLabel("Rule 1 methods").fill("post put");
    await page.getByLabel("Rule 1 path").fill("/repos/");
    await page.getByLabel("Rule 1 action").selectOption("ask");
    await page.getByRole("button", { name: "Add rule" }).click();
    await page.getByLabel("Rule 2 host").fill("evil.example.test");
    await page.getByLabel("Rule 2 action").selectOption("deny");
    await page.getByLabel("Allow hosts (one a line)").fill("api.example.test\ncdn.example.test");
    await page.getByLabel("Otherwise").selectOption("deny");
    await page.getByRole("button", { name: "Save policy" }).click();
    await page.getByText("Saved: default's sandboxes").waitFor();
    expect((await api(ts.url, "GET", "/policy")).json["policy"]).toEqual({
      rules: [
        { host: "*.example.test", methods: ["POST", "PUT"], path: "/repos/", action: "ask" },
        { host: "evil.example.test", action: "deny" },
      ],
      allow_hosts: ["api.example.test", "cdn.example.test"],
      default: "deny",
    });

    // Another tenant's, picked by the admin; the page reads back what was saved.
    await page.getByLabel("Tenant").selectOption("acme");
    await page.locator('[data-policy="none"]').waitFor();
    await page.getByLabel("Tenant").selectOption("default");
    await expect.poll(() => page.getByLabel("Rule 2 host").inputValue()).toBe("evil.example.test");
    await page.getByRole("button", { name: "Remove rule 1" }).click();
    await page.getByRole("button", { name: "Save policy" }).click();
    await expect
      .poll(async () => ((await api(ts.url, "GET", "/policy")).json["policy"] as { rules: unknown[] }).rules)
      .toEqual([{ host: "evil.example.test", action: "deny" }]);

    // A pattern the API refuses: its words, nothing saved.
    await page.getByLabel("Rule 1 host").fill("bad host");
    await page.getByRole("button", { name: "Save policy" }).click();
    await expect.poll(() => page.getByRole("alert").textContent()).toContain("host");
    expect(await accessibilityViolations(page)).toEqual([]);
    await shot("policy");

    await page.getByRole("button", { name: "Remove policy" }).click();
    await page.locator('[data-policy="none"]').waitFor();
    expect((await api(ts.url, "GET", "/policy")).json["policy"]).toBeNull();
  });

  it("charts usage per day and tenant against the budget, and keeps each tenant to its own days", async () => {
    const today = new Date().toISOString().slice(0, 10);
    await meter(ts, "acme", [today], 12);
    await meter(ts, "default", [today], 1.5);
    await open("usage", "Usage");
    const acme = page.locator('tr[data-owner="acme"]');
    await acme.waitFor();
    // acme's budget (10 vCPU hours, 20 GiB hours, set above) against its 12 hours.
    const cell = async (i: number) => (await acme.locator("td").nth(i).textContent())?.replace(/\s+/g, " ");
    expect(await cell(1)).toBe("12.0 of 10.0 120%");
    expect(await cell(2)).toBe("12.0 of 20.0 60%");
    expect(await acme.locator("td").nth(3).textContent()).toBe("vcpu_hours");
    await page.locator("figure.chart canvas").first().waitFor();
    expect(await page.locator("figure.chart").count()).toBe(2);
    expect(await page.getByRole("img", { name: /^vCPU hours this month: acme 12\.00 of 10 budget/ }).count()).toBe(1);
    expect(await accessibilityViolations(page)).toEqual([]);
    await shot("usage");

    // The attacker's side: a key of acme reads acme's days and no other tenant's.
    const acmeKey = (await api(ts.url, "POST", "/keys", { tenant: "acme", name: "acme", scopes: ["sandboxes:read"] }))
      .json["key"] as string;
    const days = await api(ts.url, "GET", "/usage/days?days=2", undefined, { authorization: `Bearer ${acmeKey}` });
    expect(days.status).toBe(200);
    expect(days.json["days"]).toEqual([{ day: today, owner: "acme", vcpu_hours: 12, gib_hours: 12 }]);
    const bad = await api(ts.url, "GET", "/usage/days?days=1000");
    expect(bad.status).toBe(400);
    expect(bad.json["code"]).toBe("invalid_request");
  });

  it("shows /metrics at a glance", async () => {
    await open("metrics", "Metrics");
    const figure = (label: string) => page.locator(`[data-figure="${label}"]`);
    await figure("In the ledger").waitFor();
    expect(await figure("In the ledger").locator(".value").textContent()).toBe("0");
    expect(await figure("Create time").locator(".value").textContent()).toBe("median none yet");
    // The 404 just asked for is counted under its code.
    // The refusals of the tests above are counted by their code.
    expect(await figure("Error answers").locator(".detail").textContent()).toMatch(/invalid_request [1-9]/);
    expect(await accessibilityViolations(page)).toEqual([]);
    await shot("metrics");
  });

  it("fits every page at a desktop's and a phone's width, with the navigation folded on the phone", async () => {
    for (const size of [DESKTOP, PHONE]) {
      await page.setViewportSize(size);
      for (const [name, heading, ready] of PAGES) {
        await open(name, heading);
        await page.locator(ready).first().waitFor();
        expect({ page: name, size: size.width, overflow: await overflowing(page) }).toEqual({
          page: name,
          size: size.width,
          overflow: [],
        });
        if (size === PHONE) await shot(`phone-${name}`);
      }
    }
    // On the phone the links are behind the Menu button, which opens and closes them.
    const nav = page.getByRole("navigation", { name: "Main" });
    expect(await nav.isVisible()).toBe(false);
    await page.getByRole("button", { name: "Menu" }).click();
    await nav.getByRole("link", { name: "Usage" }).click();
    await page.getByRole("heading", { name: "Usage", level: 1 }).waitFor();
    await nav.waitFor({ state: "hidden" });
    expect(await accessibilityViolations(page)).toEqual([]);
    await page.setViewportSize(DESKTOP);
    expect(await page.getByRole("button", { name: "Menu" }).isVisible()).toBe(false);
  });

  it("reaches every control of every admin page by Tab, each with a visible focus ring", async () => {
    await page.setViewportSize(DESKTOP);
    for (const [name, heading, ready] of PAGES.slice(2)) {
      await open(name, heading);
      await page.locator(ready).first().waitFor();
      // Each control the page shows is numbered; Tab must land on every number, and on nothing else.
      const controls = await page.evaluate<number>(NUMBER_CONTROLS);
      const reached = new Set<string>();
      await page.locator("body").focus();
      for (let i = 0; i < controls + 2; i++) {
        await page.keyboard.press("Tab");
        const focused = await page.evaluate<{ tab: string; ring: boolean } | null>(FOCUSED);
        if (focused === null) continue;
        expect({ page: name, ...focused }).toEqual({ page: name, tab: focused.tab, ring: true });
        expect(focused.tab).toMatch(/^\d+$/);
        reached.add(focused.tab);
      }
      expect({ page: name, reached: reached.size }).toEqual({ page: name, reached: controls });
    }
  });

  it("a read-only key sees no admin page and no button that would fail", async () => {
    const { key } = (await api(ts.url, "POST", "/keys", { name: "viewer", scopes: ["sandboxes:read"] })).json as {
      key: string;
    };
    const viewer = await browser.newContext({ viewport: PHONE });
    try {
      const view = await viewer.newPage();
      const viewErrors: string[] = [];
      recordErrors(view, viewErrors);
      // The sign-in page fits a phone too.
      await view.goto(`${ui}/ui/`);
      await view.getByLabel("API key").waitFor();
      expect(await overflowing(view)).toEqual([]);
      await view.setViewportSize(DESKTOP);
      await signIn(view, ui, key);
      const nav = view.getByRole("navigation", { name: "Main" });
      expect(await nav.getByRole("link").allTextContents()).toEqual(["Sandboxes", "Approvals", "Policy", "Usage"]);
      // Their addresses show the sandbox list instead.
      for (const name of ["secrets", "tenants", "metrics", "keys"]) {
        await view.goto(`${ui}/ui/#/${name}`);
        await view.getByRole("heading", { name: "Sandboxes", level: 1 }).waitFor();
      }
      await open("policy", "Host policy", view);
      await view.getByText("This key lacks the policy scope").waitFor();
      expect(await view.getByRole("button").allTextContents()).toEqual(["Sign out"]);
      await open("usage", "Usage", view);
      await view.locator('tr[data-owner="default"]').waitFor();
      // Only a re-read, which a read-only key may do; no other tenant's row.
      expect(await view.getByRole("button").allTextContents()).toEqual(["Sign out", "Refresh"]);
      expect(await view.locator('tr[data-owner="acme"]').count()).toBe(0);
      expect(viewErrors).toEqual([]);
    } finally {
      await viewer.close();
    }
  });

  it("logged no console error and no page error on any page", () => {
    expect(errors).toEqual([]);
  });
});
