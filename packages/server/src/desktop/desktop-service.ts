/**
 * A sandbox's desktop (template `desktop`): Xvfb, openbox, x11vnc and Chromium, started on the
 * first call that needs them by bothy's helper (`@bothy/guest/desktop.mjs`), which is copied into
 * the sandbox and run on its Node. Screenshots are encoded to PNG in there; mouse and keyboard go
 * through xdotool. Everything runs inside the sandbox; the server only relays.
 */
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { z } from "zod";
import {
  BothyError,
  DESKTOP_DEFAULT_HEIGHT,
  DESKTOP_DEFAULT_WIDTH,
  desktopAction,
  desktopInfo,
  type DesktopInfo,
} from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import { openableUrl, openInChromium } from "./open-url.ts";

const HELPER_PATH = "/tmp/bothy-desktop.mjs";
const SHOT_DIR = "/tmp/.bothy-desktop";
/** Chromium's first start under gVisor takes a few seconds; under emulated QEMU, minutes. */
const START_TIMEOUT_MS = 180_000;
const CALL_TIMEOUT_MS = 60_000;
const MAX_SCREENSHOT_BYTES = 32 * 1024 * 1024;

const helperFailure = z.object({
  ok: z.literal(false),
  error: z.enum(["not_desktop", "not_started", "failed"]),
  missing: z.string().optional(),
  what: z.string().optional(),
  message: z.string().optional(),
});
const startReport = z.union([desktopInfo.extend({ ok: z.literal(true) }), helperFailure]);
const shotReport = z.union([
  z.object({ ok: z.literal(true), width: z.number().int(), height: z.number().int(), bytes: z.number().int() }),
  helperFailure,
]);

let bundle: Promise<Buffer> | undefined;
function helper(): Promise<Buffer> {
  bundle ??= readFile(createRequire(import.meta.url).resolve("@bothy/guest/desktop.mjs"));
  bundle.catch(() => (bundle = undefined));
  return bundle;
}

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a short command of ours in the sandbox; stdout whole (bounded), stderr's tail. */
function run(agent: AgentClient, cmd: string, env: Record<string, string>, timeoutMs: number): Promise<Run> {
  return new Promise((resolve, reject) => {
    let stdout = "";
    let stderr = "";
    const handle = agent.exec(
      { cmd, cwd: "/", env: { DISPLAY: ":1", ...env } },
      {
        onStarted: () => undefined,
        onOutput: (fd, data, consumed) => {
          if (fd === 1) stdout = (stdout + data.toString("utf8")).slice(-64 * 1024);
          else stderr = (stderr + data.toString("utf8")).slice(-2000);
          consumed();
        },
        onExited: (code) => {
          clearTimeout(timer);
          resolve({ code, stdout, stderr });
        },
        onError: (err) => {
          clearTimeout(timer);
          reject(err);
        },
      },
    );
    const timer = setTimeout(() => {
      handle.signal("SIGKILL");
      reject(new BothyError("desktop_failed", `The desktop did not answer within ${timeoutMs / 1000} s.`));
    }, timeoutMs);
  });
}

function lastJsonLine(stdout: string): unknown {
  const line = stdout.trim().split("\n").at(-1) ?? "";
  try {
    return JSON.parse(line) as unknown;
  } catch {
    return undefined;
  }
}

function notAvailable(id: string, missing: string | undefined): BothyError {
  return new BothyError(
    "desktop_not_available",
    `Sandbox ${id} has no desktop${missing ? ` (${missing} is not installed)` : ""}: create the sandbox with template "desktop" (or a template built from it) to use the screen, mouse and keyboard.`,
  );
}

/** xdotool's arguments for an action; text and keys travel in the environment, never in the command line. */
function xdotool(action: z.output<typeof desktopAction>): { cmd: string; env: Record<string, string> } {
  const button = { left: 1, middle: 2, right: 3 } as const;
  const wheel = { up: 4, down: 5, left: 6, right: 7 } as const;
  switch (action.action) {
    case "move":
      return { cmd: `xdotool mousemove ${action.x} ${action.y}`, env: {} };
    case "click":
      return {
        cmd: `xdotool mousemove ${action.x} ${action.y} click --repeat ${action.count} ${button[action.button]}`,
        env: {},
      };
    case "scroll":
      return {
        cmd: `xdotool mousemove ${action.x} ${action.y} click --repeat ${action.amount} ${wheel[action.direction]}`,
        env: {},
      };
    case "type":
      return { cmd: 'xdotool type --delay 8 -- "$BOTHY_TEXT"', env: { BOTHY_TEXT: action.text } };
    case "key":
      // DESKTOP_KEYS_RE allows letters, digits, _, + and single spaces: the unquoted split is safe.
      return { cmd: "xdotool key --delay 30 -- $BOTHY_KEYS", env: { BOTHY_KEYS: action.keys } };
  }
}

export class DesktopService {
  /** Per agent connection: a new agent (restart, wake from disk) checks the desktop again. */
  private readonly started = new WeakMap<AgentClient, Promise<DesktopInfo>>();

  constructor(private readonly manager: SandboxManager) {}

  /**
   * Starts what is not running yet; `size` applies only when the screen starts. `recheck` asks
   * the sandbox again (an explicit start) instead of trusting an earlier answer on this connection.
   */
  start(
    id: string,
    size = { width: DESKTOP_DEFAULT_WIDTH, height: DESKTOP_DEFAULT_HEIGHT },
    recheck = false,
  ): Promise<DesktopInfo> {
    const agent = this.manager.agent(id);
    if (recheck) this.started.delete(agent);
    let known = this.started.get(agent);
    if (!known) {
      known = this.launch(agent, id, size);
      this.started.set(agent, known);
      known.catch(() => this.started.delete(agent));
    }
    return known;
  }

  private async launch(agent: AgentClient, id: string, size: { width: number; height: number }): Promise<DesktopInfo> {
    let script: Buffer;
    try {
      script = await helper();
    } catch (err) {
      throw new BothyError(
        "desktop_failed",
        "bothy's desktop helper is not built on this server: run `npm run build`.",
        {
          cause: err,
        },
      );
    }
    await agent.writeFile(HELPER_PATH, script, { mode: 0o600 });
    const result = await run(agent, `node ${HELPER_PATH} start ${size.width} ${size.height}`, {}, START_TIMEOUT_MS);
    const report = startReport.safeParse(lastJsonLine(result.stdout));
    if (!report.success)
      throw new BothyError(
        "desktop_failed",
        `The desktop helper in sandbox ${id} gave no report (exit ${result.code}): ${result.stderr.slice(-300)}`,
      );
    if (report.data.ok) {
      const { ok: _ok, ...info } = report.data;
      return info;
    }
    if (report.data.error === "not_desktop") throw notAvailable(id, report.data.missing);
    throw new BothyError(
      "desktop_failed",
      `The desktop in sandbox ${id} did not start: ${report.data.message ?? report.data.error}. Its logs are in /tmp/.bothy-desktop/ inside the sandbox.`,
    );
  }

  /** Forgets what it knew, so the next call checks (and starts) the desktop again. */
  private forget(id: string): void {
    this.started.delete(this.manager.agent(id));
  }

  async screenshot(id: string): Promise<{ png: Buffer; width: number; height: number }> {
    for (let attempt = 0; ; attempt++) {
      await this.start(id);
      const agent = this.manager.agent(id);
      const out = `${SHOT_DIR}/shot-${randomBytes(6).toString("hex")}.png`;
      const result = await run(agent, `node ${HELPER_PATH} screenshot ${out}`, {}, CALL_TIMEOUT_MS);
      const report = shotReport.safeParse(lastJsonLine(result.stdout));
      if (report.success && report.data.ok) {
        try {
          const png = await agent.readFile(out, MAX_SCREENSHOT_BYTES);
          return { png, width: report.data.width, height: report.data.height };
        } finally {
          await agent.remove(out).catch(() => undefined);
        }
      }
      // The helper or the screen went away inside the sandbox (killed, or the sandbox restarted): start again, once.
      if (attempt === 0) {
        this.forget(id);
        continue;
      }
      throw new BothyError(
        "desktop_failed",
        `The screenshot in sandbox ${id} failed: ${report.success && !report.data.ok ? (report.data.message ?? report.data.error) : result.stderr.slice(-300)}`,
      );
    }
  }

  async act(id: string, input: unknown): Promise<{ action: string; width: number; height: number }> {
    const parsed = desktopAction.safeParse(input);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      const where = issue?.path.length ? `${issue.path.join(".")}: ` : "";
      throw new BothyError(
        "invalid_request",
        `desktop action: ${where}${issue?.message ?? "invalid"}. Actions: move {x,y}, click {x,y,button?,count?}, type {text}, key {keys}, scroll {x,y,direction,amount?}.`,
      );
    }
    const action = parsed.data;
    for (let attempt = 0; ; attempt++) {
      const screen = await this.start(id);
      if ("x" in action && (action.x >= screen.width || action.y >= screen.height))
        throw new BothyError(
          "invalid_request",
          `(${action.x}, ${action.y}) is off the screen: it is ${screen.width}x${screen.height} pixels, the size of a screenshot.`,
        );
      const { cmd, env } = xdotool(action);
      const result = await run(this.manager.agent(id), cmd, env, CALL_TIMEOUT_MS);
      if (result.code === 0) return { action: action.action, width: screen.width, height: screen.height };
      if (attempt === 0 && /open display/i.test(result.stderr)) {
        this.forget(id);
        continue;
      }
      throw new BothyError(
        "desktop_failed",
        `xdotool failed in sandbox ${id} (exit ${result.code}): ${result.stderr.slice(-300)}`,
      );
    }
  }

  /** Opens a URL (or an absolute path in the sandbox) in a new tab of the desktop's Chromium. */
  async openUrl(id: string, target: string): Promise<void> {
    const url = openableUrl(target);
    const screen = await this.start(id);
    await openInChromium(await this.manager.agent(id).openTcp(screen.cdp_port), screen.cdp_port, url);
  }
}
