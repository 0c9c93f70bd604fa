/**
 * A sandbox's desktop (template `desktop`): Xvfb, openbox, x11vnc and Chromium, started on the
 * first call that needs them by bothy's helper (`@bothy/guest/desktop.mjs`), which is copied into
 * the sandbox and run on its Node. The helper's server lives with the desktop and takes one
 * request a connection over the guest channel: a screenshot, encoded to PNG in there, or input
 * lines for its long-lived xdotool (mouse and keys); typing text runs its own xdotool. Everything
 * runs inside the sandbox; the server only relays, and checks what comes back (helper-answer.ts).
 */
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
import { callHelper, checkedInput, checkedShot, type HelperRequest } from "./helper-answer.ts";

const HELPER_PATH = "/tmp/bothy-desktop.mjs";
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
const startReport = z.union([
  desktopInfo.extend({ ok: z.literal(true), helper_port: z.number().int().min(1).max(65535) }),
  helperFailure,
]);

/** A started desktop: what the API shows, and the port of the helper's server (not shown). */
interface Started {
  info: DesktopInfo;
  helperPort: number;
}

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

/**
 * An action as lines for the helper's `xdotool -` (script mode splits each line on spaces and has
 * no quoting): coordinates are integers and keys match DESKTOP_KEYS_RE, so no line can carry
 * another command. Text to type has any characters: it runs as its own xdotool with the text in
 * the environment, never in a command line (`typing`).
 */
function xdotoolLines(action: z.output<typeof desktopAction>): string[] | undefined {
  const button = { left: 1, middle: 2, right: 3 } as const;
  const wheel = { up: 4, down: 5, left: 6, right: 7 } as const;
  switch (action.action) {
    case "move":
      return [`mousemove ${action.x} ${action.y}`];
    case "click":
      // --delay is the pause after each click: a double click needs one between its two, a single none.
      return [
        `mousemove ${action.x} ${action.y}`,
        `click --repeat ${action.count} --delay ${action.count > 1 ? 80 : 0} ${button[action.button]}`,
      ];
    case "scroll":
      return [
        `mousemove ${action.x} ${action.y}`,
        `click --repeat ${action.amount} --delay 10 ${wheel[action.direction]}`,
      ];
    case "key":
      return action.keys.split(" ").map((chord) => `key --delay 30 ${chord}`);
    case "type":
      return undefined;
  }
}

const typing = (text: string): { cmd: string; env: Record<string, string> } => ({
  cmd: 'xdotool type --delay 8 -- "$BOTHY_TEXT"',
  env: { BOTHY_TEXT: text },
});

export class DesktopService {
  /** Per agent connection: a new agent (restart, wake from disk) checks the desktop again. */
  private readonly started = new WeakMap<AgentClient, Promise<Started>>();

  constructor(private readonly manager: SandboxManager) {}

  /**
   * Starts what is not running yet; `size` applies only when the screen starts. `recheck` asks
   * the sandbox again (an explicit start) instead of trusting an earlier answer on this connection.
   */
  async start(
    id: string,
    size = { width: DESKTOP_DEFAULT_WIDTH, height: DESKTOP_DEFAULT_HEIGHT },
    recheck = false,
  ): Promise<DesktopInfo> {
    return (await this.ensure(id, size, recheck)).info;
  }

  private async ensure(
    id: string,
    size = { width: DESKTOP_DEFAULT_WIDTH, height: DESKTOP_DEFAULT_HEIGHT },
    recheck = false,
  ): Promise<Started> {
    const agent = await this.manager.agent(id);
    if (recheck) this.started.delete(agent);
    let known = this.started.get(agent);
    if (!known) {
      known = this.launch(agent, id, size);
      this.started.set(agent, known);
      known.catch(() => this.started.delete(agent));
    }
    return known;
  }

  private async launch(agent: AgentClient, id: string, size: { width: number; height: number }): Promise<Started> {
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
      const { ok: _ok, helper_port: helperPort, ...info } = report.data;
      return { info, helperPort };
    }
    if (report.data.error === "not_desktop") throw notAvailable(id, report.data.missing);
    throw new BothyError(
      "desktop_failed",
      `The desktop in sandbox ${id} did not start: ${report.data.message ?? report.data.error}. Its logs are in /tmp/.bothy-desktop/ inside the sandbox.`,
    );
  }

  /** Forgets what it knew, so the next call checks (and starts) the desktop again. */
  private async forget(id: string): Promise<void> {
    this.started.delete(await this.manager.agent(id));
  }

  /** One request to the helper's server; `undefined` when it does not listen (the desktop went away). */
  private async ask(
    id: string,
    port: number,
    request: HelperRequest,
  ): Promise<{ report: unknown; body: Buffer } | undefined> {
    const stream = await (await this.manager.agent(id)).openTcp(port).catch((err: unknown) => {
      if (err instanceof BothyError && err.code === "port_not_listening") return undefined;
      throw err;
    });
    return stream && callHelper(stream, request, MAX_SCREENSHOT_BYTES, CALL_TIMEOUT_MS);
  }

  async screenshot(id: string): Promise<{ png: Buffer; width: number; height: number }> {
    for (let attempt = 0; ; attempt++) {
      const { helperPort } = await this.ensure(id);
      const answer = await this.ask(id, helperPort, { do: "shot" });
      const shot = answer && checkedShot(answer);
      if (shot?.ok) return { png: shot.png, width: shot.width, height: shot.height };
      // The helper or the screen went away inside the sandbox (killed, or the sandbox restarted): start again, once.
      if (attempt === 0) {
        await this.forget(id);
        continue;
      }
      throw new BothyError(
        "desktop_failed",
        `The screenshot in sandbox ${id} failed: ${shot ? (shot.message ?? shot.error) : "the desktop helper does not answer"}.`,
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
      const { info: screen, helperPort } = await this.ensure(id);
      if ("x" in action && (action.x >= screen.width || action.y >= screen.height))
        throw new BothyError(
          "invalid_request",
          `(${action.x}, ${action.y}) is off the screen: it is ${screen.width}x${screen.height} pixels, the size of a screenshot.`,
        );
      const done = { action: action.action, width: screen.width, height: screen.height };
      // Start again, once, only where nothing ran: the helper's server is gone, or xdotool found no
      // display (the desktop's processes went away: killed, or the sandbox restarted).
      let failure: string;
      let nothingRan: boolean;
      const lines = xdotoolLines(action);
      if (lines) {
        const answer = await this.ask(id, helperPort, { do: "input", lines });
        const result = answer && checkedInput(answer);
        if (result?.ok) return done;
        failure = result ? (result.message ?? result.error) : "the desktop helper does not answer";
        nothingRan = result === undefined;
      } else {
        const { cmd, env } = typing(action.action === "type" ? action.text : "");
        const result = await run(await this.manager.agent(id), cmd, env, CALL_TIMEOUT_MS);
        if (result.code === 0) return done;
        failure = `exit ${result.code}: ${result.stderr.slice(-300)}`;
        nothingRan = /open display/i.test(result.stderr);
      }
      if (attempt === 0 && nothingRan) {
        await this.forget(id);
        continue;
      }
      throw new BothyError("desktop_failed", `xdotool failed in sandbox ${id}: ${failure}`);
    }
  }

  /** Opens a URL (or an absolute path in the sandbox) in a new tab of the desktop's Chromium. */
  async openUrl(id: string, target: string): Promise<void> {
    const url = openableUrl(target);
    const screen = await this.start(id);
    await openInChromium(await (await this.manager.agent(id)).openTcp(screen.cdp_port), screen.cdp_port, url);
  }
}
