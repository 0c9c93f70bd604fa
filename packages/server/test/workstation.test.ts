import { readFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chromium, type Browser, type Page } from "playwright-core";
import { PNG } from "pngjs";
import { Sandbox } from "@bothy/sdk";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { noLeaks } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

/**
 * Issue 18's end-to-end proof, in ONE gVisor sandbox of the `workstation` template (fullstack +
 * desktop): PostgreSQL and Redis started with `bothy-service`, a small web app from the fixtures
 * (Python's http.server, psycopg2, redis) using both, opened in the sandbox's own Chromium; a note
 * typed into its form with the desktop's mouse and keyboard (the SDK's computer actions), seen in a
 * screenshot (tesseract, in a second sandbox of `workspace`, reads the note back from the PNG), stored in PostgreSQL and counted in
 * Redis; then the same app from the host through its port URL. Playwright over CDP only watches
 * (where the field is, when the page has loaded): nothing is typed or clicked through it.
 * QEMU is left out as in desktop.test.ts: emulated here (TCG), Chromium is too slow for a test.
 */
const APP = readFileSync(new URL("./fixtures/notes-app.py", import.meta.url));
const APP_PORT = 8000;
const gvisor = testDrivers().find((d) => d.name === "gvisor");
const missing = gvisor?.missing;

/** Polls until `check` holds (the screen and the page change on their own time); fails after `tries`. */
async function eventually(what: string, check: () => Promise<boolean>, tries = 200): Promise<void> {
  for (let i = 0; i < tries; i++) {
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 150));
  }
  throw new Error(`${what}: never happened`);
}

/** How many pixels of a region differ between two screenshots of the same size. */
function changedPixels(a: Uint8Array, b: Uint8Array, box: { x: number; y: number; w: number; h: number }): number {
  const [one, two] = [PNG.sync.read(Buffer.from(a)), PNG.sync.read(Buffer.from(b))];
  let changed = 0;
  for (let y = box.y; y < box.y + box.h; y++)
    for (let x = box.x; x < box.x + box.w; x++) {
      const at = (y * one.width + x) * 4;
      if ([0, 1, 2].some((i) => one.data[at + i] !== two.data[at + i])) changed++;
    }
  return changed;
}

/** Lower-case letters and digits only: what OCR reads reliably, whatever it makes of spaces. */
const letters = (text: string): string => text.toLowerCase().replace(/[^a-z0-9]/g, "");

describe.skipIf(missing !== undefined)(driverTitle({ name: "gvisor", missing }, "workstation template"), () => {
  let ts: TestServer;
  let box: Sandbox;
  /** A sandbox of `workspace`, which has tesseract: it reads the screenshot, nothing else. */
  let reader: Sandbox;
  let cdp: Browser | undefined;

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor" });
    box = await Sandbox.create({ baseUrl: ts.url, template: "workstation", vcpu: 2, memoryMib: 1536 });
    reader = await Sandbox.create({ baseUrl: ts.url, template: "workspace", vcpu: 1, memoryMib: 512 });
  });
  afterAll(async () => {
    await cdp?.close().catch(() => undefined);
    for (const sandbox of [box, reader]) await sandbox?.kill({ wait: true }).catch(() => undefined);
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  const sh = async (cmd: string): Promise<string> => (await box.commands.run(cmd)).stdout;

  it(
    "runs an app on PostgreSQL and Redis, fills its form in the sandbox's Chromium, and serves it to the host",
    { timeout: 300_000 },
    async () => {
      // The stack: one command per service, then the app in the background.
      expect(await sh("bothy-service start postgres")).toBe("postgres: running\n");
      expect(await sh("bothy-service start redis")).toBe("redis: running\n");
      await box.files.write("/workspace/notes-app.py", APP);
      await box.commands.run(`python3 /workspace/notes-app.py ${APP_PORT} > /tmp/notes-app.log 2>&1`, {
        background: true,
      });
      await eventually("the app listens", async () => (await box.ports.list()).some((p) => p.port === APP_PORT));

      // The sandbox's browser opens the app, driven by keyboard only.
      const empty = await box.desktop.screenshot();
      await box.desktop.key("ctrl+l");
      await box.desktop.type(`http://127.0.0.1:${APP_PORT}/`);
      await box.desktop.key("Return");
      cdp = await chromium.connectOverCDP(await box.desktop.cdpUrl());
      let tab: Page | undefined;
      await eventually("the app's page is shown", async () => {
        tab = cdp!
          .contexts()[0]
          ?.pages()
          .find((p) => p.url() === `http://127.0.0.1:${APP_PORT}/`);
        return (await tab?.evaluate<string>("document.readyState")) === "complete";
      });
      expect(await tab!.evaluate<string>("document.getElementById('saved').textContent")).toBe("saved 0");
      const before = await box.desktop.screenshot();
      expect(changedPixels(empty.png, before.png, { x: 0, y: 200, w: 1280, h: 400 })).toBeGreaterThan(0);

      // Where the field is on the screen (window origin plus the browser's toolbars): click it, type, Enter.
      const [screenX, screenY, chrome] = await tab!.evaluate<number[]>("[screenX, screenY, outerHeight - innerHeight]");
      const note = `Ada Lovelace ${String(Date.now()).slice(-6)}`;
      await box.desktop.click(screenX! + 400, screenY! + chrome! + 60);
      await box.desktop.type(note);
      await box.desktop.key("Return");
      // The form posted, the app answered 303 and the browser shows the page again, with the note.
      await eventually(
        "the page lists the note",
        async () => (await tab!.evaluate<string>("document.getElementById('notes').textContent")) === note,
      );
      expect(await tab!.evaluate<string>("document.getElementById('saved').textContent")).toBe("saved 1");

      // The screenshot shows it: the list's region changed, and tesseract reads the note from the PNG.
      const after = await box.desktop.screenshot();
      expect(
        changedPixels(before.png, after.png, { x: 0, y: screenY! + chrome! + 120, w: 1280, h: 300 }),
      ).toBeGreaterThan(0);
      await reader.files.write("/tmp/screen.png", after.png);
      const ocr = (await reader.commands.run("tesseract /tmp/screen.png - 2>/dev/null")).stdout;
      expect(letters(ocr)).toContain(letters(note));
      expect(letters(ocr)).toContain("saved1");

      // Stored where the app says: the row in PostgreSQL, the count in Redis.
      expect(await sh(`psql -tA -c "SELECT body FROM notes"`)).toBe(`${note}\n`);
      expect(await sh(`redis-cli -u "$REDIS_URL" GET notes:saved`)).toBe("1\n");

      // The host reaches the same app through its port URL: the page, its JSON, and a second note.
      const url = box.ports.url(APP_PORT);
      expect(url).toBe(`${ts.url}/sandboxes/${box.sandboxId}/ports/${APP_PORT}/`);
      const page = await fetch(url);
      expect(page.status).toBe(200);
      const html = await page.text();
      expect(html).toContain(`<li>${note}</li>`);
      expect(html).toContain("saved 1");
      const posted = await fetch(new URL("notes", url), {
        method: "POST",
        headers: { "content-type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams({ body: "from the host" }).toString(),
        redirect: "manual",
      });
      expect(posted.status).toBe(303);
      expect(new URL(posted.headers.get("location")!, posted.url).href).toBe(url);
      expect(await (await fetch(new URL("notes.json", url))).json()).toEqual({
        notes: ["from the host", note],
        saved: 2,
      });
      expect(await sh(`psql -tA -c "SELECT count(*) FROM notes"`)).toBe("2\n");

      // The sandbox's browser sees the host's note after a reload (F5 on its keyboard).
      await box.desktop.key("F5");
      await eventually(
        "the sandbox's page lists both notes",
        async () =>
          (await tab!.evaluate<string>("document.getElementById('notes').textContent")) === `from the host${note}`,
      );
    },
  );
});
