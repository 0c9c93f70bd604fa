/**
 * The desktop's helper, copied into a sandbox of the `desktop` template and run there on the
 * template's Node (like the image downscaler): the server never decodes the sandbox's screen.
 *
 *   node desktop.mjs start WIDTH HEIGHT   starts what is not running yet (Xvfb, openbox, x11vnc,
 *                                          Chromium with its DevTools port, the screenshot server)
 *                                          and waits until each answers
 *   node desktop.mjs serve                 the helper's server (started by `start`), on
 *                                          127.0.0.1:HELPER_PORT: each connection sends one JSON
 *                                          line and gets one back, then is closed:
 *                                          `{do:"shot"}` → `{ok, width, height, bytes}` and that
 *                                          many bytes of PNG; `{do:"input", lines}` → `{ok}` once
 *                                          xdotool has run the lines
 *
 * `start` prints one JSON line on stdout (a DesktopHelperReport, checked by the server). Exit 0 when
 * it did what was asked; 3 when the template has no desktop. The server lives as long as the
 * desktop, so a screenshot costs an encode and an action a line to one long-lived `xdotool -`, not
 * a process start each (Node ~0.5 s, xdotool ~0.1-0.2 s under gVisor's ptrace, measured).
 */
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { connect, createServer, type Socket } from "node:net";
import { createInterface } from "node:readline";
import { encodeRgbPng } from "./png.ts";
import { xwdSize, xwdToRgbRows } from "./xwd.ts";

const DIR = "/tmp/.bothy-desktop";
const DISPLAY = ":1";
const X_SOCKET = "/tmp/.X11-unix/X1";
const VNC_PORT = 5900;
const CDP_PORT = 9222;
const HELPER_PORT = 5910;
const INPUT_TIMEOUT_MS = 10_000;
const MAX_REQUEST_BYTES = 64 * 1024;
const FRAMEBUFFER = `${DIR}/Xvfb_screen0`;
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

/** Whether a Chromium window is mapped on the screen (xdotool exits 1 when it finds none). */
function chromiumWindowShown(): Promise<boolean> {
  return new Promise((resolve) => {
    const search = spawn("xdotool", ["search", "--onlyvisible", "--class", "chromium"], {
      stdio: "ignore",
      env: { ...process.env, DISPLAY },
    });
    search.on("error", () => resolve(false));
    search.on("exit", (code) => resolve(code === 0));
  });
}

function screenSize(): { width: number; height: number } | undefined {
  try {
    return xwdSize(readFileSync(FRAMEBUFFER));
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
  if (!running("helper", "node") || !(await answers(HELPER_PORT))) {
    launch("helper", process.execPath, [process.argv[1]!, "serve"]);
    started.push("helper");
  }
  await until("x11vnc", () => answers(VNC_PORT), deadline);
  await until("Chromium's DevTools port", () => answers(CDP_PORT), deadline);
  // DevTools answers before the window is on the screen; keys sent before then reach no window
  // (an agent's first ctrl+l right after the start was lost), so the start waits for the window.
  await until("Chromium's window", () => chromiumWindowShown(), deadline);
  await until("the desktop helper's server", () => answers(HELPER_PORT), deadline);
  const size = screenSize();
  if (!size) say({ ok: false, error: "failed", what: "Xvfb", message: "no readable framebuffer" }, 1);
  say({
    ok: true,
    display: DISPLAY,
    ...size,
    vnc_port: VNC_PORT,
    cdp_port: CDP_PORT,
    helper_port: HELPER_PORT,
    started,
  });
}

/** The screen now, as a report and its PNG. */
async function shot(): Promise<{ report: Record<string, unknown>; body?: Buffer }> {
  let file: Buffer;
  try {
    file = readFileSync(FRAMEBUFFER);
  } catch {
    return { report: { ok: false, error: "not_started" } };
  }
  try {
    const { width, height, rows } = xwdToRgbRows(file);
    const png = await encodeRgbPng(width, height, rows);
    return { report: { ok: true, width, height, bytes: png.length }, body: png };
  } catch (err) {
    return { report: { ok: false, error: "failed", message: (err as Error).message } };
  }
}

/** One `xdotool -` for the server's life: it runs script lines as they arrive. */
let xdotool: { child: ChildProcessWithoutNullStreams; waiting: Array<(line: string | undefined) => void> } | undefined;
let inputQueue: Promise<unknown> = Promise.resolve();

function xdotoolProcess(): NonNullable<typeof xdotool> {
  if (xdotool && xdotool.child.exitCode === null) return xdotool;
  const child = spawn("xdotool", ["-"], { env: { ...process.env, DISPLAY } });
  const proc = { child, waiting: [] as Array<(line: string | undefined) => void> };
  createInterface({ input: child.stdout }).on("line", (line) => proc.waiting.shift()?.(line));
  child.stderr.resume();
  const gone = (): void => {
    for (const w of proc.waiting.splice(0)) w(undefined);
    if (xdotool === proc) xdotool = undefined;
  };
  child.on("exit", gone);
  child.on("error", gone);
  child.stdin.on("error", gone);
  xdotool = proc;
  return proc;
}

/**
 * Runs the lines, then `getmouselocation`, whose output line says xdotool has done them all (the
 * other commands print nothing). One request at a time; a stuck xdotool is killed and replaced.
 */
function input(lines: string[]): Promise<Record<string, unknown>> {
  const run = (): Promise<Record<string, unknown>> =>
    new Promise((resolve) => {
      const proc = xdotoolProcess();
      const timer = setTimeout(() => {
        proc.child.kill("SIGKILL");
        resolve({ ok: false, error: "failed", message: `xdotool did not finish within ${INPUT_TIMEOUT_MS / 1000} s` });
      }, INPUT_TIMEOUT_MS);
      proc.waiting.push((line) => {
        clearTimeout(timer);
        resolve(line === undefined ? { ok: false, error: "failed", message: "xdotool exited" } : { ok: true });
      });
      proc.child.stdin.write(`${lines.join("\n")}\ngetmouselocation\n`);
    });
  const result = inputQueue.then(run);
  inputQueue = result;
  return result;
}

function answer(socket: Socket, report: Record<string, unknown>, body?: Buffer): void {
  const line = Buffer.from(`${JSON.stringify(report)}\n`);
  socket.end(body ? Buffer.concat([line, body]) : line);
}

async function handle(socket: Socket, request: unknown): Promise<void> {
  const req = request as { do?: unknown; lines?: unknown };
  if (req.do === "shot") {
    const { report, body } = await shot();
    return answer(socket, report, body);
  }
  if (
    req.do === "input" &&
    Array.isArray(req.lines) &&
    req.lines.every((l) => typeof l === "string" && !l.includes("\n"))
  )
    return answer(socket, await input(req.lines as string[]));
  answer(socket, { ok: false, error: "failed", message: "unknown request" });
}

function serve(): void {
  const server = createServer((socket) => {
    socket.on("error", () => socket.destroy());
    let head = "";
    const onData = (chunk: Buffer): void => {
      head += chunk.toString("utf8");
      const nl = head.indexOf("\n");
      if (nl < 0) {
        if (head.length > MAX_REQUEST_BYTES) socket.destroy();
        return;
      }
      socket.off("data", onData);
      let request: unknown;
      try {
        request = JSON.parse(head.slice(0, nl));
      } catch {
        return answer(socket, { ok: false, error: "failed", message: "the request is not JSON" });
      }
      void handle(socket, request);
    };
    socket.on("data", onData);
  });
  server.on("error", (err) => {
    process.stderr.write(`the desktop helper's server stopped: ${err.message}\n`);
    process.exit(1);
  });
  server.listen(HELPER_PORT, "127.0.0.1");
}

const [verb, ...args] = process.argv.slice(2);
if (verb === "start" && args.length === 2) {
  const [width, height] = args.map(Number) as [number, number];
  await start(width, height);
} else if (verb === "serve" && args.length === 0) serve();
else {
  process.stderr.write("usage: desktop start WIDTH HEIGHT | desktop serve\n");
  process.exit(2);
}
