/**
 * The dashboard at /ui in the host's Chromium, against a real server and one gVisor sandbox:
 * signing in (a bad key and a revoked key refused) and out, the live list and its filter, the
 * create form, the terminal (its size told to the shell), files up and down, the sandbox page at
 * a desktop's and a phone's width and by keyboard alone, and no serious accessibility violation
 * on any page (the approvals inbox, which needs the real gateway, is dashboard-approvals.test.ts).
 * Then the attacker's side: a page served from that sandbox's port, opened by a signed-in viewer,
 * by path on the API's own host and by a preview host of the same site, can neither read nor use
 * the session; a request with the cookie but without the CSRF token is refused.
 */
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { PNG } from "pngjs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Sandbox } from "@bothy/sdk";
import { ANONYMOUS } from "../../../test/auth.ts";
import { startBackgroundCommand } from "./helpers/background.ts";
import { api, pollUntil, putSandboxFile, runCommand, waitDeleted } from "./helpers/client.ts";
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
import { useServerWithSandbox } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

const pexec = promisify(execFile);
const BOTHY = fileURLToPath(new URL("../../cli/bin/bothy.js", import.meta.url));
const ATTACK_SERVER = readFileSync(new URL("./fixtures/dashboard-attack-server.mjs", import.meta.url), "utf8");
/** Preview hosts under the API's name: the same site, as a real deployment would have. */
const DOMAIN = `preview.${API_HOST}`;
const PORT = 8000;
const gvisor = testDriver("gvisor");
const missing = gvisor.missing ?? dashboardMissing();

describe.skipIf(missing !== undefined)(driverTitle({ name: "gvisor", missing }, "the dashboard at /ui"), () => {
  let ts: TestServer;
  let id: string;
  let browser: Browser;
  let context: BrowserContext;
  let page: Page;
  /** The dashboard's origin, as the viewer's browser names it. */
  let ui: string;
  const errors: string[] = [];

  useServerWithSandbox(
    "gvisor",
    (server, sandbox) => {
      ts = server;
      id = sandbox;
      ui = `http://${API_HOST}:${new URL(server.url).port}`;
    },
    { BOTHY_PREVIEW_DOMAIN: DOMAIN },
  );

  beforeAll(async () => {
    browser = await launchDashboardBrowser("127.0.0.1");
    context = await browser.newContext({ acceptDownloads: true, viewport: DESKTOP });
    page = await context.newPage();
    recordErrors(page, errors);
  });

  afterAll(async () => {
    await browser?.close();
  });

  const shot = (name: string): Promise<Buffer> => page.screenshot({ path: `${ARTIFACTS}${name}.png` });
  const row = (sandbox: string) => page.locator(`tr[data-sandbox="${sandbox}"]`);

  it("refuses a bad key, signs in with the admin key as an HttpOnly SameSite=Strict cookie", async () => {
    await page.goto(`${ui}/ui/`);
    await page.getByLabel("API key").fill(`bothy_${"0".repeat(64)}`);
    await page.getByRole("button", { name: "Sign in" }).click();
    await expect.poll(() => page.getByRole("alert").textContent()).toContain("not valid");
    expect(await accessibilityViolations(page)).toEqual([]);
    await shot("sign-in");

    await page.getByLabel("API key").fill(ts.apiKey);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("heading", { name: "Sandboxes" }).waitFor();
    const cookies = await context.cookies(ui);
    expect(cookies.map((c) => ({ name: c.name, httpOnly: c.httpOnly, sameSite: c.sameSite, path: c.path }))).toEqual([
      { name: "bothy_session", httpOnly: true, sameSite: "Strict", path: "/" },
    ]);
    // The key is in no cookie and no URL the browser holds.
    expect(JSON.stringify(cookies)).not.toContain(ts.apiKey);
    expect(page.url()).not.toContain(ts.apiKey);
  });

  it("serves the assets with long caching and every page with a strict CSP", async () => {
    const index = await fetch(`${ts.url}/ui/`, { headers: ANONYMOUS });
    expect(index.headers.get("cache-control")).toBe("no-cache");
    const csp = index.headers.get("content-security-policy") ?? "";
    expect(csp).toContain("script-src 'self'");
    expect(csp).toContain("frame-ancestors 'none'");
    expect(csp).not.toMatch(/script-src[^;]*unsafe-inline/);
    const asset = /src="(\/ui\/assets\/[^"]+\.js)"/.exec(await index.text())?.[1];
    const res = await fetch(`${ts.url}${asset}`, { headers: ANONYMOUS });
    expect(res.status).toBe(200);
    expect(res.headers.get("cache-control")).toBe("public, max-age=31536000, immutable");
  });

  it("creates a sandbox from the form, and the list shows sandboxes appear and vanish live", async () => {
    await row(id).waitFor();
    const before = await page.locator("tr[data-sandbox]").evaluateAll((rows) => rows.map((r) => r.dataset["sandbox"]));
    await page.getByRole("button", { name: "Create sandbox" }).click();
    await expect.poll(() => page.locator("tr[data-sandbox]").count(), { timeout: 60_000 }).toBe(before.length + 1);
    const made = (
      await page.locator("tr[data-sandbox]").evaluateAll((rows) => rows.map((r) => r.dataset["sandbox"]))
    ).find((s) => !before.includes(s))!;
    expect((await api(ts.url, "GET", `/sandboxes/${made}`)).json["state"]).toBe("running");
    // The usage column: what the running sandbox has metered, from GET /usage/sandboxes.
    await expect
      .poll(() => row(id).locator("td[data-usage]").textContent(), { timeout: 60_000 })
      .toMatch(/^\d+ vCPU·s · \d+\.\d GiB·s$/);
    expect(await accessibilityViolations(page)).toEqual([]);
    await shot("sandboxes");

    // Deleted elsewhere: it leaves the list without a reload (from /events).
    await api(ts.url, "DELETE", `/sandboxes/${made}`);
    await row(made).waitFor({ state: "detached", timeout: 60_000 });
    // Made elsewhere: it appears; deleted with its button: it goes.
    const other = (await Sandbox.create({ baseUrl: ts.url, template: "seed" })).sandboxId;
    await row(other).waitFor({ timeout: 60_000 });
    await page.getByRole("button", { name: `Delete ${other}` }).click();
    await row(other).waitFor({ state: "detached", timeout: 60_000 });
    await waitDeleted(ts.url, other);
  });

  it("filters the list by id, state, template, driver or label", async () => {
    await page.goto(`${ui}/ui/#/sandboxes`);
    await row(id).waitFor();
    const filter = page.getByLabel("Filter");
    const count = page.locator(".count");
    const total = await page.locator("tr[data-sandbox]").count();
    for (const words of [id.slice(4, 12), "running seed", `gvisor ${id.slice(-6)}`]) {
      await filter.fill(words);
      await expect.poll(() => count.textContent()).toBe(`1 of ${total}`);
      expect(await page.locator("tr[data-sandbox]").count()).toBe(1);
    }
    await filter.fill("qemu");
    await expect.poll(() => count.textContent()).toBe(`0 of ${total}`);
    expect(await row(id).count()).toBe(0);
    await filter.fill("");
    await row(id).waitFor();
  });

  it("runs `echo hi` in the terminal and shows hi", async () => {
    await page.goto(`${ui}/ui/#/sandbox/${id}`);
    await page.locator('.term-box[data-status="connected"]').waitFor({ timeout: 30_000 });
    await page.locator(".term-box").click();
    await page.keyboard.type("echo hi\n");
    await expect
      .poll(async () => (await page.locator(".xterm-rows > div").allInnerTexts()).map((t) => t.trim()), {
        timeout: 30_000,
      })
      .toContain("hi");
    expect(await accessibilityViolations(page)).toEqual([]);
    await shot("sandbox");
  });

  it("tells the shell the terminal's size, and its new size when the window narrows", async () => {
    /** The last `rows cols` line `stty size` printed in the terminal. */
    const size = async (): Promise<[number, number] | undefined> => {
      const lines = (await page.locator(".xterm-rows > div").allInnerTexts()).map((t) => t.trim());
      const found = lines.filter((l) => /^\d+ \d+$/.test(l)).at(-1);
      return found === undefined ? undefined : (found.split(" ").map(Number) as [number, number]);
    };
    await page.keyboard.type("stty size\n");
    await expect.poll(size, { timeout: 30_000 }).toBeDefined();
    const [rows, cols] = (await size())!;
    expect(cols).toBeGreaterThan(80);
    try {
      await page.setViewportSize({ width: 700, height: DESKTOP.height });
      await page.keyboard.type("clear; stty size\n");
      await expect.poll(async () => (await size())?.[1], { timeout: 30_000 }).toBeLessThan(cols * 0.7);
      expect((await size())?.[0]).toBe(rows);
    } finally {
      await page.setViewportSize(DESKTOP);
    }
  });

  it("uploads a file and downloads it byte-identically", async () => {
    const bytes = randomBytes(200_000);
    await page.locator('input[name="upload"]').setInputFiles({
      name: "blob.bin",
      mimeType: "application/octet-stream",
      buffer: bytes,
    });
    await page.getByRole("button", { name: "blob.bin", exact: true }).waitFor({ timeout: 30_000 });
    const inside = await fetch(`${ts.url}/sandboxes/${id}/files?path=/workspace/blob.bin`);
    expect(Buffer.from(await inside.arrayBuffer()).equals(bytes)).toBe(true);
    const [download] = await Promise.all([
      page.waitForEvent("download"),
      page.getByRole("button", { name: "blob.bin", exact: true }).click(),
    ]);
    expect((await readFile(await download.path())).equals(bytes)).toBe(true);
  });

  it("runs a command in the background, re-attaches after leaving the page and sees its output continue live, and kills one", async () => {
    const gate = "/tmp/dashboard-go";
    const cmd = `echo n1-before; while [ ! -e ${gate} ]; do sleep 0.1; done; echo n2-after; exit 3`;
    await page.goto(`${ui}/ui/#/sandbox/${id}`);
    await page.getByLabel("Command", { exact: true }).fill(cmd);
    await page.getByRole("button", { name: "Run in background" }).click();
    const first = page.locator(".command-output");
    await expect.poll(() => first.locator("pre").textContent(), { timeout: 30_000 }).toContain("n1-before");
    const commandId = (await first.getAttribute("data-command"))!;
    expect(commandId).toMatch(/^cmd_/);

    // Leave the page (its sockets close) and come back: the command still runs, listed as such.
    await page.goto(`${ui}/ui/#/sandboxes`);
    await page.getByRole("heading", { name: "Sandboxes" }).waitFor();
    await page.goto(`${ui}/ui/#/sandbox/${id}`);
    const listed = page.locator(`tr[data-command="${commandId}"]`);
    await expect.poll(() => listed.getAttribute("data-state"), { timeout: 30_000 }).toBe("running");
    expect(await listed.locator("code").textContent()).toBe(cmd);
    await page.getByRole("button", { name: `Attach ${commandId}` }).click();
    const output = page.locator(`.command-output[data-command="${commandId}"]`);
    // The earlier output from the server's replay buffer, then the later one live.
    await expect.poll(() => output.getAttribute("data-status"), { timeout: 30_000 }).toBe("live");
    await expect.poll(() => output.locator("pre").textContent()).toContain("n1-before");
    expect(await output.locator("pre").textContent()).not.toContain("n2-after");
    await runCommand(ts.wsUrl, id, { cmd: `touch ${gate}` });
    await expect.poll(() => output.locator("pre").textContent(), { timeout: 30_000 }).toBe("n1-before\nn2-after\n");
    await expect.poll(() => output.getAttribute("data-status")).toBe("exited 3");
    // The list follows from the command.exited event: exited, with its exit code.
    await expect.poll(() => listed.getAttribute("data-state"), { timeout: 30_000 }).toBe("exited");
    expect(await listed.locator("td[data-exit]").textContent()).toBe("3");
    expect(await accessibilityViolations(page)).toEqual([]);
    await shot("sandbox-commands");

    // Kill: a command that would run for ten minutes ends by SIGKILL from its Kill button.
    await page.getByLabel("Command", { exact: true }).fill("echo k-started; exec sleep 600");
    await page.getByRole("button", { name: "Run in background" }).click();
    const killed = page.locator(".command-output");
    await expect.poll(() => killed.locator("pre").textContent(), { timeout: 30_000 }).toContain("k-started");
    const killedId = (await killed.getAttribute("data-command"))!;
    await page.getByRole("button", { name: `Kill ${killedId}` }).click();
    await expect.poll(() => killed.getAttribute("data-status"), { timeout: 30_000 }).toBe("killed by SIGKILL");
    const info = (await api(ts.url, "GET", `/sandboxes/${id}/commands/${killedId}`)).json;
    expect([info["state"], info["signal"]]).toEqual(["exited", "SIGKILL"]);
  });

  it("previews text cut at 64 KiB and images as <img> of a blob; a sandbox's HTML and SVG never run on the dashboard's origin", async () => {
    const html = `<script>window.owned = "html"</script><img src=x onerror="window.owned = 'img'"><b id="evil-bold">b</b>`;
    const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="8" height="6" onload="top.owned = 'svg'"><script>top.owned = "svg-script"</script><rect width="8" height="6" fill="red"/></svg>`;
    const png = new PNG({ width: 4, height: 3 });
    png.data.fill(200);
    const put = async (name: string, body: string | Buffer): Promise<void> => {
      const res = await fetch(`${ts.url}/sandboxes/${id}/files?path=/workspace/${name}`, {
        method: "PUT",
        headers: { "content-type": "application/octet-stream" },
        body,
      });
      expect(res.status).toBe(200);
    };
    await put("long.txt", `${"x".repeat(99)}\n`.repeat(1000));
    await put("evil.html", html);
    await put("evil.svg", svg);
    await put("grey.png", PNG.sync.write(png));
    await page.goto(`${ui}/ui/#/sandboxes`);
    await page.goto(`${ui}/ui/#/sandbox/${id}`);
    const preview = page.locator(".file-preview");

    await page.getByRole("button", { name: "Preview long.txt" }).click();
    await preview.locator("[data-cut]").waitFor({ timeout: 30_000 });
    expect(await preview.locator("[data-cut]").textContent()).toContain("first 64 KiB of 100000 bytes");
    expect((await preview.locator("pre").textContent())?.length).toBe(64 * 1024);

    for (const [name, width] of [
      ["grey.png", 4],
      ["evil.svg", 8],
    ] as const) {
      await page.getByRole("button", { name: `Preview ${name}` }).click();
      const img = preview.locator("img");
      await expect
        .poll(() => img.evaluate((el) => (el as unknown as { naturalWidth: number }).naturalWidth), { timeout: 30_000 })
        .toBe(width);
      expect(await img.getAttribute("src")).toMatch(/^blob:/);
    }
    await page.getByRole("button", { name: "Preview evil.html" }).click();
    await expect.poll(() => preview.locator("pre").textContent(), { timeout: 30_000 }).toBe(html);
    // Shown as text: nothing of the file became part of the page, and none of its script ran.
    expect(await page.locator("#evil-bold").count()).toBe(0);
    expect(await page.evaluate<unknown>("window.owned")).toBeUndefined();
    expect(await accessibilityViolations(page)).toEqual([]);
    await shot("sandbox-files");
    await page.getByRole("button", { name: "Close preview" }).click();
  });

  it("shows an upload's progress as it goes", async () => {
    await page.goto(`${ui}/ui/#/sandboxes`);
    await page.goto(`${ui}/ui/#/sandbox/${id}`);
    const bytes = randomBytes(512 * 1024);
    // The upload is slowed (DevTools' network throttling) so that it takes many progress events.
    const cdp = await context.newCDPSession(page);
    await cdp.send("Network.enable");
    await cdp.send("Network.emulateNetworkConditions", {
      offline: false,
      latency: 0,
      downloadThroughput: -1,
      uploadThroughput: 256 * 1024,
    });
    try {
      // What the progress line says, each time it changes (the page keeps no history of it).
      await page.evaluate(`{
        const seen = (window.progressSeen = []);
        new MutationObserver(() => {
          const text = document.querySelector(".upload-progress span")?.textContent;
          if (text && seen.at(-1) !== text) seen.push(text);
        }).observe(document.body, { subtree: true, childList: true, characterData: true });
      }`);
      await page.locator('input[name="upload"]').setInputFiles({
        name: "progress.bin",
        mimeType: "application/octet-stream",
        buffer: bytes,
      });
      await page.getByText("Uploaded progress.bin").waitFor({ timeout: 60_000 });
    } finally {
      await cdp.send("Network.emulateNetworkConditions", {
        offline: false,
        latency: 0,
        downloadThroughput: -1,
        uploadThroughput: -1,
      });
      await cdp.detach();
    }
    const seen = await page.evaluate<string[]>("window.progressSeen");
    const sent = seen.map((t) => Number(/^(\d+) of 524288 bytes$/.exec(t)?.[1]));
    expect(sent.every((n) => Number.isInteger(n))).toBe(true);
    expect(sent.some((n) => n > 0 && n < bytes.length)).toBe(true);
    expect(sent).toEqual([...sent].sort((a, b) => a - b));
    expect(sent.at(-1)).toBe(bytes.length);
    const inside = await fetch(`${ts.url}/sandboxes/${id}/files?path=/workspace/progress.bin`);
    expect(Buffer.from(await inside.arrayBuffer()).equals(bytes)).toBe(true);
  });

  it("sets the expiry from the sandbox page, opens its ports as signed links, shows its policy and audit", async () => {
    await startBackgroundCommand(
      ts.url,
      id,
      `node -e "require('http').createServer((q, s) => s.end('port-${PORT + 1}-ok')).listen(${PORT + 1})"`,
    );
    await pollUntil(
      `port ${PORT + 1} listening in ${id}`,
      async () =>
        ((await api(ts.url, "GET", `/sandboxes/${id}/ports`)).json["ports"] as Array<{ port: number }>).some(
          (p) => p.port === PORT + 1,
        ),
      60_000,
    );
    await page.goto(`${ui}/ui/#/sandbox/${id}`);
    await page.getByRole("button", { name: "Refresh" }).click();
    const [tab] = await Promise.all([
      context.waitForEvent("page"),
      page.getByRole("button", { name: `Open port ${PORT + 1}` }).click(),
    ]);
    // The new tab carries the link's token on the sandbox's preview host, not the session.
    await expect.poll(() => tab.locator("body").textContent(), { timeout: 30_000 }).toBe(`port-${PORT + 1}-ok`);
    expect(new URL(tab.url()).host).toBe(`${PORT + 1}-${id}.${DOMAIN}:${new URL(ui).port}`);
    await tab.close();

    await page.getByLabel("Expire in (hours)").selectOption("4");
    const asked = Date.now();
    await page.getByRole("button", { name: "Set expiry" }).click();
    await expect
      .poll(async () => Date.parse(String((await api(ts.url, "GET", `/sandboxes/${id}`)).json["expires_at"])) - asked)
      .toBeGreaterThan(4 * 3600_000 - 60_000);
    // The page shows it once the answer to its own call is in, which may be after the API has it.
    const expires = (await api(ts.url, "GET", `/sandboxes/${id}`)).json["expires_at"];
    await expect.poll(() => page.locator('[data-fact="expires"]').textContent()).toBe(expires);
    // This server runs without networking: no host policy, no egress decisions.
    await page.getByText("No host policy: its HTTP(S) goes out directly.").waitFor();
    await page.getByText("No egress decisions yet.").waitFor();
    // gVisor sleeps by itself when idle: no pause button that would fail.
    expect(await page.getByRole("button", { name: "Pause" }).count()).toBe(0);
    expect(await accessibilityViolations(page)).toEqual([]);
  });

  it("fits the sandbox page at a desktop's and a phone's width with no serious accessibility violation, and reaches its every control by Tab", async () => {
    const ready = async (): Promise<void> => {
      await page.goto(`${ui}/ui/#/sandboxes`);
      await page.goto(`${ui}/ui/#/sandbox/${id}`);
      await page.locator('.term-box[data-status="connected"]').waitFor({ timeout: 30_000 });
      await page.locator("tr[data-command]").first().waitFor({ timeout: 30_000 });
      await page.getByRole("button", { name: "blob.bin", exact: true }).waitFor({ timeout: 30_000 });
      await page.getByRole("button", { name: `Open port ${PORT + 1}` }).waitFor({ timeout: 30_000 });
    };
    try {
      for (const size of [DESKTOP, PHONE]) {
        await page.setViewportSize(size);
        await ready();
        expect({
          size: size.width,
          overflow: await overflowing(page),
          violations: await accessibilityViolations(page),
        }).toEqual({ size: size.width, overflow: [], violations: [] });
        if (size === PHONE) await page.screenshot({ path: `${ARTIFACTS}phone-sandbox.png`, fullPage: true });
      }
      // By keyboard: every control once, the terminal's input too (which Escape then Tab leaves, as its hint says).
      await page.setViewportSize(DESKTOP);
      await ready();
      const walk = await walkByTab(page);
      expect({ problems: walk.problems, reached: walk.reached.size }).toEqual({ problems: [], reached: walk.controls });
      expect(await page.locator(".term-box textarea").getAttribute("aria-describedby")).toBe("terminal-keys");
    } finally {
      await page.setViewportSize(DESKTOP);
    }
  });

  it("a link from `bothy ui-link` signs a browser in once with no key in a URL or log; used, revoked or minted by a session: refused", async () => {
    const minted = await api(ts.url, "POST", "/keys", { name: "linked", scopes: ["sandboxes:read"] });
    const { key, key_id: keyId } = minted.json as { key: string; key_id: string };
    const uiLink = async (): Promise<string> => {
      const { stdout } = await pexec(process.execPath, [BOTHY, "ui-link", "--url", ts.url, "--api-key", key]);
      const printed = stdout.trim();
      expect(printed).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/ui\/#link=[A-Za-z0-9_-]{43}$/);
      // The viewer's browser knows the server by its name.
      return printed.replace(ts.url, ui);
    };
    const link = await uiLink();
    const viewer = await browser.newContext();
    try {
      const open = async (url: string): Promise<Page> => {
        const view = await viewer.newPage();
        recordErrors(view, errors);
        await view.goto(url);
        return view;
      };
      const first = await open(link);
      await first.locator(`tr[data-sandbox="${id}"]`).waitFor();
      // The token left the address bar and the history at once.
      expect(first.url()).toBe(`${ui}/ui/#/sandboxes`);
      expect((await viewer.cookies(ui)).map((c) => c.name)).toEqual(["bothy_session"]);
      await viewer.clearCookies();

      // Used once: the same link signs nobody in again.
      const again = await open(link);
      await expect.poll(() => again.getByRole("alert").textContent()).toContain("sign-in link is not valid");
      await again.getByLabel("API key").waitFor();
      expect(await viewer.cookies(ui)).toEqual([]);

      // Made before its key was revoked: refused.
      const second = await uiLink();
      expect((await api(ts.url, "DELETE", `/keys/${keyId}`)).status).toBe(200);
      const revoked = await open(second);
      await expect.poll(() => revoked.getByRole("alert").textContent()).toContain("sign-in link is not valid");
      expect(await viewer.cookies(ui)).toEqual([]);

      // A page running with the admin's dashboard session cannot mint a link (one would outlive the session).
      await page.goto(`${ui}/ui/#/sandboxes`);
      await page.getByRole("heading", { name: "Sandboxes" }).waitFor();
      const asked = await page.evaluate(async () => {
        const who = await (await fetch("/ui/session", { headers: { "x-csrf-token": "fetch" } })).json();
        const res = await fetch("/ui/links", {
          method: "POST",
          headers: { "content-type": "application/json", "x-csrf-token": (who as { csrf_token: string }).csrf_token },
          body: "{}",
        });
        return { status: res.status, code: ((await res.json()) as { code: string }).code };
      });
      expect(asked).toEqual({ status: 403, code: "scope_missing" });
      // Neither the key nor a link's token reached the server's log.
      const log = await readFile(ts.logPath, "utf8");
      for (const secret of [key, link.split("#link=")[1]!, second.split("#link=")[1]!])
        expect(log).not.toContain(secret);
    } finally {
      await viewer.close();
    }
  });

  it("the Keys page creates a key shown once, lists it and revokes it", async () => {
    await page.goto(`${ui}/ui/#/keys`);
    await page.getByRole("heading", { name: "Keys" }).waitFor();
    await page.getByLabel("Name").fill("from-the-page");
    await page.getByRole("checkbox", { name: "sandboxes:read" }).check();
    await page.getByRole("button", { name: "Create key" }).click();
    const shown = (await page.getByRole("status").locator("output").textContent()) ?? "";
    expect(shown).toMatch(/^bothy_/);
    const as = { authorization: `Bearer ${shown}` };
    expect((await api(ts.url, "GET", "/sandboxes", undefined, as)).status).toBe(200);
    expect(await accessibilityViolations(page)).toEqual([]);
    await shot("keys");
    await page.getByRole("button", { name: "Done" }).click();
    // Shown once: gone from the page, and no answer of the list holds it.
    expect(await page.content()).not.toContain(shown);
    await page.getByRole("button", { name: "Revoke from-the-page" }).click();
    await expect.poll(async () => (await api(ts.url, "GET", "/sandboxes", undefined, as)).status).toBe(401);
    const listed = (await api(ts.url, "GET", "/keys")).json["keys"] as Array<{
      name: string;
      revoked_at: string | null;
    }>;
    expect(listed.find((k) => k.name === "from-the-page")?.revoked_at).not.toBeNull();
    expect(JSON.stringify(listed)).not.toContain(shown);
  });

  it("a read-only key sees no buttons that would fail; its revocation ends the session", async () => {
    const minted = await api(ts.url, "POST", "/keys", { name: "viewer", scopes: ["sandboxes:read"] });
    const { key, key_id: keyId } = minted.json as { key: string; key_id: string };
    const viewer = await browser.newContext();
    try {
      const view = await viewer.newPage();
      await view.goto(`${ui}/ui/`);
      await view.getByLabel("API key").fill(key);
      await view.getByRole("button", { name: "Sign in" }).click();
      await view.locator(`tr[data-sandbox="${id}"]`).waitFor();
      expect(await view.getByRole("button", { name: "Create sandbox" }).count()).toBe(0);
      expect(await view.getByRole("button", { name: /^Delete / }).count()).toBe(0);
      // No Keys page for a key without keys:manage: not in the navigation, and its address shows the list.
      expect(await view.getByRole("link", { name: "Keys" }).count()).toBe(0);
      await view.goto(`${ui}/ui/#/keys`);
      await view.getByRole("heading", { name: "Sandboxes" }).waitFor();
      expect(await view.getByRole("button", { name: /^Revoke / }).count()).toBe(0);
      await view.goto(`${ui}/ui/#/sandbox/${id}`);
      await view.getByRole("heading", { name: "Audit" }).waitFor();
      await view.getByText(`Port ${PORT + 1}`).waitFor();
      for (const name of ["Set expiry", "Pause", "Resume", `Open port ${PORT + 1}`])
        expect(await view.getByRole("button", { name }).count()).toBe(0);
      // Commands: the list, without run, attach or kill; and the API refuses them to this session.
      await view.locator("tr[data-command]").first().waitFor();
      expect(await view.getByRole("button", { name: "Run in background" }).count()).toBe(0);
      expect(await view.getByRole("button", { name: /^(Attach|Replay|Kill) / }).count()).toBe(0);
      expect(await view.getByRole("checkbox", { name: /Control/ }).count()).toBe(0);
      const running = (await api(ts.url, "GET", `/sandboxes/${id}/commands`)).json["commands"] as Array<{
        command_id: string;
      }>;
      const refused = await view.evaluate(
        async ([sandbox, command, wsBase]) => {
          const who = (await (await fetch("/ui/session", { headers: { "x-csrf-token": "fetch" } })).json()) as {
            csrf_token: string;
          };
          const run = await fetch(`/sandboxes/${sandbox}/commands`, {
            method: "POST",
            headers: { "content-type": "application/json", "x-csrf-token": who.csrf_token },
            body: JSON.stringify({ cmd: "touch /tmp/read-only-ran" }),
          });
          const socket = (path: string, first: string): Promise<string> =>
            new Promise((resolve) => {
              const ws = new WebSocket(`${wsBase}${path}`);
              ws.onopen = () => ws.send(first);
              ws.onmessage = (m) => resolve(`opened ${String(m.data)}`);
              ws.onerror = () => resolve("refused");
              ws.onclose = () => resolve("closed");
            });
          return {
            run: `${run.status} ${((await run.json()) as { code: string }).code}`,
            start: await socket(`/sandboxes/${sandbox}/command`, JSON.stringify({ cmd: "touch /tmp/read-only-ran" })),
            attach: await socket(
              `/sandboxes/${sandbox}/commands/${command}`,
              JSON.stringify({ type: "signal", signal: "SIGKILL" }),
            ),
          };
        },
        [id, running[0]!.command_id, ui.replace(/^http/, "ws")] as const,
      );
      expect(refused).toEqual({ run: "403 scope_missing", start: "refused", attach: "refused" });
      expect((await runCommand(ts.wsUrl, id, { cmd: "test -e /tmp/read-only-ran" })).exit?.exit_code).toBe(1);

      expect((await api(ts.url, "DELETE", `/keys/${keyId}`)).status).toBe(200);
      await view.reload();
      await view.getByLabel("API key").waitFor();
      const asked = await view.evaluate(async () => (await fetch("/ui/session")).status);
      expect(asked).toBe(401);
    } finally {
      await viewer.close();
    }
  });

  it("signs out: the session ends at the server, the cookie goes, the page asks for a key", async () => {
    const other = await browser.newContext();
    try {
      const view = await other.newPage();
      recordErrors(view, errors);
      await signIn(view, ui, ts.apiKey);
      const cookie = (await other.cookies(ui)).find((c) => c.name === "bothy_session")!.value;
      await view.getByRole("button", { name: "Sign out" }).click();
      await view.getByLabel("API key").waitFor();
      expect(await other.cookies(ui)).toEqual([]);
      // The old cookie, sent again by hand, is a session that no longer exists.
      const again = await fetch(`${ts.url}/ui/session`, {
        headers: { ...ANONYMOUS, cookie: `bothy_session=${cookie}`, "x-csrf-token": "any" },
      });
      expect(again.status).toBe(401);
    } finally {
      await other.close();
    }
  });

  it("refuses a request made with the cookie but without the CSRF token", async () => {
    await page.goto(`${ui}/ui/#/sandboxes`);
    const tried = await page.evaluate(async (sandbox) => {
      const answer = async (res: Response) => ({
        status: res.status,
        code: ((await res.json()) as { code: string }).code,
      });
      const post = { method: "POST", headers: { "content-type": "application/json" }, body: "{}" };
      return [
        await answer(await fetch("/sandboxes", post)),
        await answer(await fetch("/sandboxes", { ...post, headers: { ...post.headers, "x-csrf-token": "forged" } })),
        await answer(await fetch(`/sandboxes/${sandbox}/files?path=/workspace/blob.bin`)),
      ];
    }, id);
    expect(tried).toEqual([
      { status: 403, code: "csrf_token_invalid" },
      { status: 403, code: "csrf_token_invalid" },
      { status: 403, code: "csrf_token_invalid" },
    ]);
    expect(ts.events.filter((e) => e.event === "sandbox_created").length).toBe(3);
    expect(errors).toEqual([]);
  });

  describe("from a page a sandbox serves", () => {
    let link: { url: string; preview: string };
    beforeAll(async () => {
      await putSandboxFile(ts.url, id, "/workspace/attack.mjs", ATTACK_SERVER);
      await startBackgroundCommand(ts.url, id, `node /workspace/attack.mjs ${PORT} > /tmp/attack.out 2>&1`);
      await pollUntil(
        `port ${PORT} listening in ${id}`,
        async () => {
          const res = await fetch(`${ts.url}/sandboxes/${id}/ports`);
          return ((await res.json()) as { ports: Array<{ port: number }> }).ports.some((p) => p.port === PORT);
        },
        60_000,
      );
      const made = await (await Sandbox.connect(id, { baseUrl: ts.url })).ports.link(PORT, { ttlS: 600 });
      // The path form on the dashboard's own host, where the viewer's session cookie lives.
      link = { url: made.url.replace(new URL(made.url).host, new URL(ui).host), preview: made.preview_url! };
    });

    it("cannot read or use the dashboard session, by path on the API's host or by a same-site preview host", async () => {
      await page.goto(`${ui}/ui/#/sandboxes`);
      await page.getByRole("heading", { name: "Sandboxes" }).waitFor();
      const answers: Array<{ url: string; status: number }> = [];
      page.on("response", (res) => {
        if (new URL(res.url()).host === new URL(ui).host && !res.url().includes("/ports/"))
          answers.push({ url: new URL(res.url()).pathname, status: res.status() });
      });
      const created = ts.events.filter((e) => e.event === "sandbox_created").length;
      const attack = async (url: string): Promise<Record<string, string>> => {
        answers.length = 0;
        await page.goto(`${url}&api=${encodeURIComponent(ui)}&sandbox=${id}`);
        await page.waitForFunction("'result' in window", undefined, { timeout: 30_000 });
        return page.evaluate<Record<string, string>>("window.result");
      };

      const statuses: number[] = [];
      for (const url of [link.url, link.preview]) {
        const result = await attack(url);
        expect(result["cookie"] ?? "").not.toContain("bothy_session");
        expect(result["session"]).toBe("blocked");
        expect(result["ws"]).toBe("refused");
        expect(result["desktop"]).toBe("refused");
        // What the server answered the page (CORS hides it from the page, not from the test): the
        // opaque origin's requests go without the SameSite=Strict cookie (401), the same-site
        // preview host's with it, refused for their Origin (403).
        const refused = answers.filter((a) => a.url === "/ui/session" || a.url === "/sandboxes");
        expect(new Set(refused.map((a) => a.url))).toEqual(new Set(["/ui/session", "/sandboxes"]));
        for (const a of refused) expect([401, 403]).toContain(a.status);
        statuses.push(...refused.map((a) => a.status));
      }
      // The same-site preview host's page sent the cookie, and its Origin had it refused.
      expect(statuses).toContain(403);
      expect(ts.events.filter((e) => e.event === "sandbox_created").length).toBe(created);
      // The session cookie never reached the sandbox's app.
      const seen = await runCommand(ts.wsUrl, id, { cmd: `cat /tmp/attack-${PORT}.log` });
      expect(seen.stdout).toContain('"url":"/?');
      expect(seen.stdout).not.toContain("bothy_session");
    });
  });

  describe("a desktop sandbox", () => {
    let desk: string;
    beforeAll(async () => {
      desk = (await Sandbox.create({ baseUrl: ts.url, template: "desktop", vcpu: 2, memoryMib: 1024 })).sandboxId;
      // The desktop's first start (Xvfb, openbox, x11vnc, Chromium) is the slow part: done here,
      // under the hook's long timeout, so the test measures the view, not a loaded machine's boot.
      expect((await api(ts.url, "POST", `/sandboxes/${desk}/desktop/start`, {})).status).toBe(200);
    });

    it("shows its screen live over the session's socket, view only unless a writer switches control on", async () => {
      const errorsBefore = errors.length;
      const sockets: string[] = [];
      page.on("websocket", (ws) => sockets.push(ws.url()));
      await page.goto(`${ui}/ui/#/sandboxes`);
      await page.goto(`${ui}/ui/#/sandbox/${desk}`);
      const screen = page.locator(".desktop-screen");
      await expect.poll(() => screen.getAttribute("data-status"), { timeout: 60_000 }).toBe("live");
      // Pixels of the view's canvas that are not black (the screen is drawn, not only connected).
      const lit = (): Promise<number> =>
        page.evaluate<number>(`{
          const canvas = document.querySelector(".desktop-screen canvas");
          const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
          let n = 0;
          for (let i = 0; i < data.length; i += 4) if (data[i] + data[i + 1] + data[i + 2] > 60) n++;
          n;
        }`);
      await expect.poll(lit, { timeout: 60_000 }).toBeGreaterThan(1000);
      // The cookie authenticated the socket: no key or token in its URL.
      const vnc = sockets.filter((u) => u.includes("/desktop/vnc"));
      expect(vnc).toEqual([`${ui.replace(/^http/, "ws")}/sandboxes/${desk}/desktop/vnc`]);
      const control = page.getByRole("checkbox", { name: "Control (mouse and keyboard)" });
      expect(await control.isChecked()).toBe(false);
      await control.check();
      expect(await accessibilityViolations(page)).toEqual([]);
      await shot("sandbox-desktop");

      const minted = await api(ts.url, "POST", "/keys", { name: "desk-viewer", scopes: ["sandboxes:read"] });
      const viewer = await browser.newContext();
      try {
        const view = await viewer.newPage();
        recordErrors(view, errors);
        await signIn(view, ui, String(minted.json["key"]));
        await view.goto(`${ui}/ui/#/sandbox/${desk}`);
        await expect
          .poll(() => view.locator(".desktop-screen").getAttribute("data-status"), { timeout: 60_000 })
          .toBe("live");
        expect(await view.getByRole("checkbox", { name: /Control/ }).count()).toBe(0);
      } finally {
        await viewer.close();
      }
      // noVNC says so on every page that is not HTTPS or localhost, as this test's http://bothy.test is;
      // it needs no more than that here (no password to hash: x11vnc inside asks for none).
      const insecure = "noVNC requires a secure context (TLS). Expect crashes!";
      expect(errors.slice(errorsBefore).filter((e) => e !== insecure)).toEqual([]);
    });
  });
});
