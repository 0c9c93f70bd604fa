/**
 * The desktop's helper, copied into a sandbox of the `desktop` template and run there on the
 * template's Node (like the image downscaler): the server never decodes the sandbox's screen.
 *
 *   node desktop.mjs start WIDTH HEIGHT   starts what is not running yet (Xvfb, openbox, x11vnc,
 *                                          Chromium with its DevTools port) and waits until each answers
 *   node desktop.mjs screenshot OUT       writes the screen as a PNG to OUT
 *
 * Each prints one JSON line on stdout (a DesktopHelperReport, checked by the server). Exit 0 when
 * it did what was asked; 3 when the template has no desktop; 4 when the desktop is not started.
 */
import { spawn } from "node:child_process";
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { PNG } from "pngjs";
import { xwdToRgba } from "./xwd.ts";

const DIR = "/tmp/.bothy-desktop";
const DISPLAY = ":1";
const X_SOCKET = "/tmp/.X11-unix/X1";
const VNC_PORT = 5900;
const CDP_PORT = 9222;
const START_TIMEOUT_MS = 90_000;

const say = (report: Record<string, unknown>, code = 0): never => {
  process.stdout.write(`${JSON.stringify(report)}\n`);
  process.exit(code);
};

/** The pid in DIR/NAME.pid when that process still runs the program it was started as. */
function running(name: string, program: string): boolean {
  try {
    const pid = Number(readFileSync(`${DIR}/${name}.pid`, "utf8"));
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8");
    return cmdline.split("\0")[0]?.endsWith(program) ?? false;
  } catch {
    return false;
  }
}

function launch(name: string, program: string, args: string[]): void {
  const log = openSync(`${DIR}/${name}.log`, "a");
  const child = spawn(program, args, {
    detached: true,
    stdio: ["ignore", log, log],
    env: { ...process.env, DISPLAY, HOME: process.env["HOME"] ?? "/root" },
  });
  closeSync(log);
  child.on("error", (err: NodeJS.ErrnoException) => {
    if (err.code === "ENOENT") say({ ok: false, error: "not_desktop", missing: program }, 3);
    say({ ok: false, error: "failed", what: name, message: err.message }, 1);
  });
  if (child.pid !== undefined) writeFileSync(`${DIR}/${name}.pid`, String(child.pid));
  child.unref();
}

function answers(target: string | number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = typeof target === "number" ? connect(target, "127.0.0.1") : connect(target);
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

async function until(what: string, check: () => Promise<boolean>, deadline: number): Promise<void> {
  while (!(await check())) {
    if (Date.now() > deadline) say({ ok: false, error: "failed", what, message: `${what} did not answer` }, 1);
    await new Promise((r) => setTimeout(r, 100));
  }
}

function screenSize(): { width: number; height: number } | undefined {
  try {
    const { width, height } = xwdToRgba(readFileSync(`${DIR}/Xvfb_screen0`));
    return { width, height };
  } catch {
    return undefined;
  }
}

async function start(width: number, height: number): Promise<void> {
  mkdirSync(DIR, { recursive: true, mode: 0o700 });
  const deadline = Date.now() + START_TIMEOUT_MS;
  const started: string[] = [];
  if (!running("xvfb", "Xvfb") || !(await answers(X_SOCKET))) {
    for (const program of ["Xvfb", "openbox", "x11vnc", "chromium", "xdotool"])
      if (!["/usr/bin/", "/usr/local/bin/"].some((d) => existsSync(d + program)))
        say({ ok: false, error: "not_desktop", missing: program }, 3);
    launch("xvfb", "Xvfb", [DISPLAY, "-screen", "0", `${width}x${height}x24`, "-fbdir", DIR, "-nolisten", "tcp"]);
    started.push("xvfb");
    await until("Xvfb", () => answers(X_SOCKET), deadline);
  }
  if (!running("openbox", "openbox")) {
    launch("openbox", "/usr/bin/openbox", []);
    started.push("openbox");
  }
  if (!running("x11vnc", "x11vnc")) {
    launch("x11vnc", "/usr/bin/x11vnc", [
      ...["-display", DISPLAY, "-rfbport", String(VNC_PORT), "-localhost", "-shared", "-forever"],
      // -threads: without it, under gVisor, x11vnc's single loop noticed a new client only 20-45 s
      // after it connected (measured); with it the greeting comes in ~0.1 s. -nolookup: no reverse
      // DNS of the client in a sandbox that may have no network.
      ...["-nopw", "-noxdamage", "-quiet", "-nolookup", "-threads"],
    ]);
    started.push("x11vnc");
  }
  if (!running("chromium", "chromium")) {
    const size = screenSize() ?? { width, height };
    launch("chromium", "/usr/bin/chromium", [
      // gVisor gives no user namespaces for Chromium's own sandbox; the sandbox is the boundary.
      ...["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check"],
      ...["--disable-background-networking", "--disable-component-update", "--disable-sync", "--password-store=basic"],
      `--remote-debugging-port=${CDP_PORT}`,
      "--remote-debugging-address=127.0.0.1",
      `--user-data-dir=${DIR}/chromium`,
      "--window-position=0,0",
      `--window-size=${size.width},${size.height}`,
      "--start-maximized",
      "about:blank",
    ]);
    started.push("chromium");
  }
  await until("x11vnc", () => answers(VNC_PORT), deadline);
  await until("Chromium's DevTools port", () => answers(CDP_PORT), deadline);
  const size = screenSize();
  if (!size) say({ ok: false, error: "failed", what: "Xvfb", message: "no readable framebuffer" }, 1);
  say({ ok: true, display: DISPLAY, ...size, vnc_port: VNC_PORT, cdp_port: CDP_PORT, started });
}

function screenshot(out: string): void {
  let file: Buffer;
  try {
    file = readFileSync(`${DIR}/Xvfb_screen0`);
  } catch {
    say({ ok: false, error: "not_started" }, 4);
  }
  const { width, height, data } = xwdToRgba(file!);
  const png = new PNG({ width, height });
  data.copy(png.data);
  const bytes = PNG.sync.write(png, { colorType: 2 });
  writeFileSync(out, bytes);
  say({ ok: true, width, height, bytes: bytes.length });
}

const [verb, ...args] = process.argv.slice(2);
if (verb === "start" && args.length === 2) {
  const [width, height] = args.map(Number) as [number, number];
  await start(width, height);
} else if (verb === "screenshot" && args.length === 1) screenshot(args[0]!);
else {
  process.stderr.write("usage: desktop start WIDTH HEIGHT | desktop screenshot OUT\n");
  process.exit(2);
}
