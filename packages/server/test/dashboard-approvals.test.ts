/**
 * The approvals inbox against the real gateway, in the network lab (helpers/net-lab.ts): a
 * sandbox under `ask` host rules makes requests through the egress gateway to the lab's own
 * `wan` server; the inbox in the host's Chromium shows each as it is held, and deciding there
 * decides the request inside the sandbox: approved goes out, denied gets 403, approved for N
 * minutes lets the next request to that host pass without asking; the inbox with requests waiting
 * is reached by keyboard alone and fits a phone. The browser's notification is
 * offered on a click, never asked for on load. Nothing here leaves the machine.
 */
import type { Browser, BrowserContext, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { testAdminKey } from "../../../test/auth.ts";
import { api, createSandbox } from "./helpers/client.ts";
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
import { driverTitle, testDriver } from "./helpers/drivers.ts";
import { bodyOf, egressProbe, type EgressCheck } from "./helpers/egress-probe.ts";
import { useNetLab } from "./helpers/net-lab.ts";
import { NAMES, PUBLIC_HTTP } from "./helpers/net-topology.ts";
import { startTlsFront, type TlsFront } from "./helpers/tls-front.ts";

const root = process.getuid?.() === 0;
const gvisor = testDriver("gvisor");
const missing = gvisor.missing ?? (root ? undefined : "root (network namespaces)") ?? dashboardMissing();

const post = (host: string, path: string, body: string): EgressCheck => ({
  kind: "http",
  address: PUBLIC_HTTP,
  host,
  method: "POST",
  path,
  body,
});

/**
 * Wraps the page's Notification so the test sees what the page asked for and showed; the real
 * one still runs (the browser context grants the permission, as a person's click on the prompt
 * would).
 */
const RECORD_NOTIFICATIONS = `(() => {
  const Real = window.Notification;
  window.__asked = 0;
  window.__shown = [];
  class Recorded extends Real {
    constructor(title, options) {
      super(title, options);
      window.__shown.push({ title, body: (options && options.body) || "" });
    }
  }
  Object.defineProperty(Recorded, "permission", { get: () => Real.permission });
  Recorded.requestPermission = (...args) => {
    window.__asked += 1;
    return Real.requestPermission(...args);
  };
  window.Notification = Recorded;
})();`;

describe.skipIf(missing !== undefined)(
  driverTitle({ name: "gvisor", missing }, "the approvals inbox, through the real gateway"),
  () => {
    const lab = useNetLab("dashboard");
    let id: string;
    let browser: Browser;
    let context: BrowserContext;
    let page: Page;
    let ui: string;
    let front: TlsFront | undefined;
    const errors: string[] = [];

    beforeAll(async () => {
      id = await createSandbox(lab.base, {
        driver: "gvisor",
        policy: {
          rules: [
            { host: NAMES.api, action: "ask" },
            { host: NAMES.other, action: "ask" },
          ],
        },
      });
      lab.made.push(id);
      // The lab's server speaks plain HTTP for a TLS proxy in front (its cookie is Secure): this is that proxy.
      front = await startTlsFront({ host: lab.topo.ctlHostAddr, port: Number(new URL(lab.base).port) }, [API_HOST]);
      ui = `https://${API_HOST}:${front.port}`;
      browser = await launchDashboardBrowser("127.0.0.1");
      // The proxy's certificate is self-signed for the test; the origin is still a secure context.
      context = await browser.newContext({ viewport: DESKTOP, ignoreHTTPSErrors: true });
      await context.grantPermissions(["notifications"], { origin: ui });
      await context.addInitScript(RECORD_NOTIFICATIONS);
      page = await context.newPage();
      recordErrors(page, errors);
      await signIn(page, ui, testAdminKey());
    }, 300_000);

    afterAll(async () => {
      await browser?.close();
      await front?.close();
    });

    /** The pending approvals of the sandbox, by the API. */
    const pendingCount = async (): Promise<number> =>
      ((await api(lab.base, "GET", `/approvals?state=pending&sandbox_id=${id}`)).json["approvals"] as unknown[]).length;

    it("a sandbox's held requests appear in the inbox; approved there it completes, denied it gets 403 inside", async () => {
      await page.goto(`${ui}/ui/#/approvals`);
      await page.getByText("Nothing is waiting for a decision.").waitFor();
      const probe = egressProbe(
        lab.base,
        id,
        {
          approved: post(NAMES.api, "/echo/orders", '{"amount":42}'),
          denied: post(NAMES.other, "/echo/refunds", '{"amount":7}'),
        },
        lab.topo.caPem,
        120_000,
      );
      const first = page.locator("li.approval", { hasText: `POST ${NAMES.api}/echo/orders` });
      const second = page.locator("li.approval", { hasText: `POST ${NAMES.other}/echo/refunds` });
      await first.waitFor({ timeout: 60_000 });
      await second.waitFor({ timeout: 60_000 });
      await expect.poll(() => first.textContent()).toContain('{"amount":42}');
      expect(await first.locator(".time-left").textContent()).toMatch(/^\d+[sm].* left$/);
      expect(await accessibilityViolations(page)).toEqual([]);
      await page.screenshot({ path: `${ARTIFACTS}approvals.png` });
      // With requests waiting: every control reached by Tab, and the cards fit a phone.
      const walk = await walkByTab(page);
      expect({ problems: walk.problems, reached: walk.reached.size }).toEqual({ problems: [], reached: walk.controls });
      await page.setViewportSize(PHONE);
      try {
        expect({ overflow: await overflowing(page), violations: await accessibilityViolations(page) }).toEqual({
          overflow: [],
          violations: [],
        });
        await page.screenshot({ path: `${ARTIFACTS}phone-approvals.png`, fullPage: true });
      } finally {
        await page.setViewportSize(DESKTOP);
      }

      await first.getByRole("button", { name: "Approve once" }).click();
      await second.getByLabel("Reason").fill("not today");
      await second.getByRole("button", { name: "Deny" }).click();
      const r = await probe;
      expect(r["approved"]?.status, JSON.stringify(r)).toBe(200);
      expect(bodyOf(r["approved"])).toMatchObject({ method: "POST", body: '{"amount":42}' });
      expect(r["denied"]?.status, JSON.stringify(r)).toBe(403);
      await first.waitFor({ state: "detached" });
      await second.waitFor({ state: "detached" });
      const denied = (await api(lab.base, "GET", `/approvals?state=denied&sandbox_id=${id}`)).json["approvals"];
      expect(denied).toMatchObject([{ host: NAMES.other, reason: "not today" }]);
    }, 300_000);

    it("notifies of a new request once asked on a click; approve for N minutes lets the next request pass unasked", async () => {
      await page.goto(`${ui}/ui/#/approvals`);
      await page.getByText("Nothing is waiting for a decision.").waitFor();
      // Nothing asks for the permission on load.
      expect(await page.evaluate("window.__asked")).toBe(0);
      await page.getByRole("button", { name: "Notify me of new requests" }).click();
      await page.getByRole("button", { name: "Notifications on" }).waitFor();
      expect(await page.evaluate("window.__asked")).toBe(1);

      const probe = egressProbe(lab.base, id, { held: post(NAMES.api, "/echo/deploy", "v2") }, lab.topo.caPem, 120_000);
      const card = page.locator("li.approval", { hasText: `POST ${NAMES.api}/echo/deploy` });
      await card.waitFor({ timeout: 60_000 });
      await expect
        .poll(() => page.evaluate("window.__shown"))
        .toEqual([{ title: "bothy: a request waits for you", body: `POST ${NAMES.api}/echo/deploy from ${id}` }]);
      await card.getByLabel("Minutes").selectOption("5");
      await card.getByRole("button", { name: `Approve ${NAMES.api} for 5 min` }).click();
      expect((await probe)["held"]?.status).toBe(200);
      // The grant is listed with its time left.
      const grant = page.locator("ul.grants li", { hasText: NAMES.api });
      await grant.waitFor();
      expect(await grant.textContent()).toMatch(/[45]m left$/);

      // The next request to that host is not held: it completes with nothing pending.
      const next = await egressProbe(lab.base, id, { again: post(NAMES.api, "/echo/deploy", "v3") }, lab.topo.caPem);
      expect(next["again"]?.status, JSON.stringify(next)).toBe(200);
      expect(await pendingCount()).toBe(0);
      // Another host under `ask` is still held.
      const other = egressProbe(lab.base, id, { held: post(NAMES.other, "/echo/x", "y") }, lab.topo.caPem, 120_000);
      const held = page.locator("li.approval", { hasText: `POST ${NAMES.other}/echo/x` });
      await held.waitFor({ timeout: 60_000 });
      await held.getByRole("button", { name: "Deny" }).click();
      expect((await other)["held"]?.status).toBe(403);
      expect(errors).toEqual([]);
    }, 300_000);

    it("creates a sandbox from the form with host rules, a vault secret by name and metadata", async () => {
      const secret = await api(lab.base, "PUT", "/secrets/github", {
        value: "test-value-not-real",
        hosts: [NAMES.api],
      });
      expect(secret.status, JSON.stringify(secret.json)).toBeLessThan(300);
      await page.goto(`${ui}/ui/#/sandboxes`);
      const ids = () => page.locator("tr[data-sandbox]").evaluateAll((rows) => rows.map((r) => r.dataset["sandbox"]));
      await page.locator(`tr[data-sandbox="${id}"]`).waitFor();
      const before = await ids();
      await page.getByText("Host policy, secrets, metadata").click();
      await page.getByLabel("Ask about hosts").fill(NAMES.api);
      await page.getByLabel("Deny hosts").fill(NAMES.other);
      await page.getByLabel("Secrets (names)").fill("github");
      await page.getByLabel("Metadata").fill("team=web");
      expect(await accessibilityViolations(page)).toEqual([]);
      await page.getByRole("button", { name: "Create sandbox" }).click();
      await expect.poll(async () => (await ids()).length, { timeout: 60_000 }).toBe(before.length + 1);
      const made = (await ids()).find((s) => !before.includes(s))!;
      lab.made.push(made);
      const info = (await api(lab.base, "GET", `/sandboxes/${made}`)).json;
      expect(info["metadata"]).toEqual({ team: "web" });
      expect(info["policy"]).toMatchObject({
        rules: [
          { host: NAMES.api, action: "ask", source: "sandbox" },
          { host: NAMES.other, action: "deny", source: "sandbox" },
        ],
        secrets: ["github"],
      });
      expect(await page.locator(`tr[data-sandbox="${made}"] .meta-cell`).textContent()).toBe("team=web");
      expect(await api(lab.base, "DELETE", `/sandboxes/${made}`)).toMatchObject({ status: 200 });
    }, 300_000);

    it("the sandbox page shows its effective policy and its audit: each egress decision", async () => {
      await page.goto(`${ui}/ui/#/sandbox/${id}`);
      await page.getByRole("heading", { name: "Policy" }).waitFor();
      const rules = page.locator("table.rules tbody tr");
      await expect
        .poll(() => rules.allInnerTexts())
        .toEqual([`${NAMES.api}\tany\task\tsandbox#0`, `${NAMES.other}\tany\task\tsandbox#1`]);
      const audit = page.locator("ol.audit li");
      await expect.poll(() => audit.count()).toBeGreaterThan(0);
      const types = new Set(await audit.evaluateAll((items) => items.map((li) => li.dataset["type"])));
      for (const t of ["egress.asked", "egress.allowed", "egress.denied"]) expect(types).toContain(t);
      const denied = page.locator('ol.audit li[data-type="egress.denied"]', { hasText: "/echo/refunds" });
      expect(await denied.count()).toBe(1);
      expect(await accessibilityViolations(page)).toEqual([]);
      await page.screenshot({ path: `${ARTIFACTS}sandbox-audit.png`, fullPage: true });
      expect(errors).toEqual([]);
    });
  },
);
