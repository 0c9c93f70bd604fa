/**
 * The dashboard's admin pages in the host's Chromium, against one real server and no sandbox:
 * tenants and quotas (a tenant deleted only once it holds nothing, and only by an admin), secrets (values write-only: never read back, never left in the page, never
 * in the log), the tenant's default host policy, usage against the budget (rows metered into the
 * ledger, as the meter would), and /metrics at a glance. Then every page that needs no sandbox at
 * a desktop's and a phone's size (nothing wider than the screen, the navigation folded on the
 * phone behind a Menu button that Escape closes), by keyboard alone (every control reached by Tab, each with a visible focus ring), with no serious
 * accessibility violation and no console error; and a read-only key sees no button that would fail.
 */
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { API_SCOPES } from "@bothy/protocol";
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
import { DESKTOP, overflowing, PHONE, walkByTab } from "./helpers/dashboard-checks.ts";
import { useTestServer } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

const missing = dashboardMissing();
/** Every page that needs no sandbox: its address, its heading, and what shows once its data is in. */
const PAGES: ReadonlyArray<[string, string, string]> = [
  ["sandboxes", "Sandboxes", ".count:not(:empty)"],
  ["approvals", "Approvals", "p.empty"],
  ["keys", "Keys", "tr[data-key]"],
  ["secrets", "Secrets", "p.empty, tr[data-secret]"],
  // The policy test above removes the default policy; the tenant deleted after it leaves the admin no tenant to pick.
  ["policy", "Host policy", `[data-policy="none"]`],
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

  it("deletes a tenant only once it holds nothing; the refusal says what it holds; a non-admin key cannot", async () => {
    await open("tenants", "Tenants");
    // The key minted for acme above keeps it: the page shows the server's words and deletes nothing.
    await page.getByRole("button", { name: "Delete acme" }).click();
    await expect
      .poll(() => page.getByRole("alert").textContent())
      .toBe("Tenant acme still has 1 API key; revoke its keys, then delete it again.");
    expect(await tenantRow("acme").count()).toBe(1);
    const refused = await api(ts.url, "DELETE", "/tenants/acme");
    expect([refused.status, refused.json["code"], refused.json["keys"]]).toEqual([409, "tenant_in_use", 1]);
    // The server's own tenant has no Delete button, and the API refuses it too.
    expect(await page.getByRole("button", { name: "Delete default" }).count()).toBe(0);
    const own = await api(ts.url, "DELETE", "/tenants/default");
    expect([own.status, own.json["code"]]).toEqual([409, "tenant_in_use"]);
    // Bad input: an unknown or malformed id is problem+json, never a 5xx.
    for (const id of ["nobody", "NOT%20A%20TENANT", "x".repeat(90)]) {
      const res = await api(ts.url, "DELETE", `/tenants/${id}`);
      expect([res.status, res.json["code"]]).toEqual([404, "tenant_not_found"]);
    }

    // The attacker's side: a key with every scope but admin (keys:manage and secrets among them) cannot delete it.
    const scopes = API_SCOPES.filter((s) => s !== "admin");
    const strong = (await api(ts.url, "POST", "/keys", { name: "not-admin", scopes })).json["key"] as string;
    const tried = await api(ts.url, "DELETE", "/tenants/acme", undefined, { authorization: `Bearer ${strong}` });
    expect([tried.status, tried.json["code"]]).toEqual([403, "scope_missing"]);
    expect((await api(ts.url, "GET", "/tenants/acme")).status).toBe(200);

    // Its key revoked, acme holds nothing: deleted from the page, its revoked key with it.
    const keys = (await api(ts.url, "GET", "/keys")).json["keys"] as Array<{ key_id: string; tenant: string }>;
    for (const k of keys.filter((k) => k.tenant === "acme"))
      expect((await api(ts.url, "DELETE", `/keys/${k.key_id}`)).status).toBe(200);
    await page.getByRole("button", { name: "Delete acme" }).click();
    await page.getByText("Deleted tenant acme.").waitFor();
    await tenantRow("acme").waitFor({ state: "detached" });
    expect((await api(ts.url, "GET", "/tenants/acme")).status).toBe(404);
    const left = (await api(ts.url, "GET", "/keys")).json["keys"] as Array<{ tenant: string }>;
    expect(left.filter((k) => k.tenant === "acme")).toEqual([]);
    // Its usage stays under its name, so the name is not given to a new tenant, which would read it.
    const again = await api(ts.url, "POST", "/tenants", { tenant: "acme" });
    expect([again.status, again.json["code"]]).toEqual([409, "tenant_exists"]);
    expect(await accessibilityViolations(page)).toEqual([]);
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
        expect({
          page: name,
          size: size.width,
          overflow: await overflowing(page),
          violations: await accessibilityViolations(page),
        }).toEqual({ page: name, size: size.width, overflow: [], violations: [] });
        if (size === PHONE) await shot(`phone-${name}`);
      }
    }
    // On the phone the links are behind the Menu button, which opens and closes them.
    const nav = page.getByRole("navigation", { name: "Main" });
    const menu = page.getByRole("button", { name: "Menu" });
    expect(await nav.isVisible()).toBe(false);
    await menu.click();
    await nav.getByRole("link", { name: "Usage" }).click();
    await page.getByRole("heading", { name: "Usage", level: 1 }).waitFor();
    await nav.waitFor({ state: "hidden" });
    // By keyboard: Enter opens it, Tab walks into its links, Escape folds it and focus is back on Menu.
    await menu.focus();
    await page.keyboard.press("Enter");
    await nav.waitFor();
    expect(await menu.getAttribute("aria-expanded")).toBe("true");
    await page.keyboard.press("Tab");
    expect(await page.evaluate<string | null>("document.activeElement.closest('nav')?.id ?? null")).toBe("main-nav");
    await page.keyboard.press("Escape");
    await nav.waitFor({ state: "hidden" });
    expect(await menu.getAttribute("aria-expanded")).toBe("false");
    expect(await page.evaluate<string>("document.activeElement.textContent")).toBe("Menu");
    expect(await accessibilityViolations(page)).toEqual([]);
    await page.setViewportSize(DESKTOP);
    expect(await menu.isVisible()).toBe(false);
  });

  it("reaches every control of every page by Tab, each with a visible focus ring", async () => {
    await page.setViewportSize(DESKTOP);
    for (const [name, heading, ready] of PAGES) {
      await open(name, heading);
      await page.locator(ready).first().waitFor();
      // Each control the page shows is numbered; Tab must land on every number, and on nothing else.
      const walk = await walkByTab(page);
      expect({ page: name, problems: walk.problems, reached: walk.reached.size }).toEqual({
        page: name,
        problems: [],
        reached: walk.controls,
      });
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
