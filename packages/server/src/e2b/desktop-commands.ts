/**
 * `@e2b/desktop` drives E2B's desktop template by shell commands through envd (`/bin/bash -l -c
 * LINE`): Xvfb, XFCE, scrot, xdg-open, x11vnc and noVNC. bothy's `desktop` template has its own
 * desktop (Xvfb on :1, openbox, x11vnc, Chromium, started by desktop/desktop-service.ts), so the
 * few lines the SDK sends to start, photograph and stream it are answered by that desktop here,
 * each mapped to a short command of ours (so the SDK still sees a real process, exit code and
 * output). Only these exact lines are mapped; every other command (xdotool, xrandr, xdpyinfo,
 * the user's own) runs as sent. The table is in docs/e2b-desktop.md.
 */
import { BothyError, desktopStartRequest } from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";
import type { DesktopService } from "../desktop/desktop-service.ts";
import type { DesktopStreams } from "./desktop-stream.ts";

export interface DesktopCommandContext {
  sandboxId: string;
  /** The key binding of the envd token that sent the command (it starts a stream). */
  binding: string | undefined;
  desktop: DesktopService;
  streams: DesktopStreams;
  agent: () => Promise<AgentClient>;
}

/** A mapped line: a step the server takes first, then the command that runs instead. */
export interface MappedCommand {
  before: () => Promise<void>;
  line: string;
  /** What the process list keeps (in the ledger) instead of the SDK's line, when that held a credential. */
  recorded?: string;
}

/** bothy's X display (packages/guest/src/desktop-main.ts). */
const BOTHY_DISPLAY = 1;

const XVFB =
  /^Xvfb :([0-9]{1,3}) -ac -screen 0 ([0-9]{1,5})x([0-9]{1,5})x24 -retro -dpi [0-9]{1,4} -nolisten tcp -nolisten unix$/;
const XFCE_RUNNING = "pgrep -x xfce4-session >/dev/null && pgrep -x xfwm4 >/dev/null && pgrep -x xfdesktop >/dev/null";
const SCROT = /^scrot --pointer (\/tmp\/screenshot-[A-Za-z0-9]{16}\.png)$/;
const XDG_OPEN = /^xdg-open (\S+)$/;
const STOREPASSWD = /^x11vnc -storepasswd ([A-Za-z0-9]{8,64}) ~\/\.vnc\/passwd$/;
const X11VNC =
  /^x11vnc -bg -display :[0-9]{1,3} -forever -wait 50 -shared -rfbport [0-9]{1,5} (-nopw|-usepw) 2>\/tmp\/x11vnc_stderr\.log( -id \S+)?$/;
const NOVNC =
  /^cd \/opt\/noVNC\/utils && \.\/novnc_proxy --vnc localhost:[0-9]{1,5} --listen ([0-9]{1,5}) --web \/opt\/noVNC > \/tmp\/novnc\.log 2>&1$/;
const NETSTAT = /^netstat -tuln \| grep ":([0-9]{1,5}) "$/;

const nothing = async (): Promise<void> => undefined;

function unsupported(message: string): never {
  throw new BothyError("not_supported", message);
}

/** The command bothy runs for one of the SDK's lines, or undefined to run the line as sent. */
export function mapDesktopCommand(line: string, ctx: DesktopCommandContext): MappedCommand | undefined {
  const { sandboxId: id, desktop, streams } = ctx;
  let m: RegExpExecArray | null;

  if ((m = XVFB.exec(line))) {
    const display = Number(m[1]);
    const size = desktopStartRequest.safeParse({ width: Number(m[2]), height: Number(m[3]) });
    if (!size.success)
      throw new BothyError(
        "invalid_request",
        `A desktop of ${m[2]}x${m[3]} pixels: bothy's is 320x240 to 3840x2160; pass such a resolution.`,
      );
    return {
      before: async () => {
        await desktop.start(id, size.data);
      },
      // The SDK's display reaches bothy's: X clients find a display's socket by its path.
      line:
        display === BOTHY_DISPLAY
          ? "true"
          : `mkdir -p /tmp/.X11-unix && ln -sfn /tmp/.X11-unix/X${BOTHY_DISPLAY} /tmp/.X11-unix/X${display}`,
    };
  }
  // bothy's window manager is openbox; the SDK waits for XFCE's three processes.
  if (line === "startxfce4") return { before: nothing, line: "true" };
  if (line === XFCE_RUNNING) return { before: nothing, line: "pgrep -x openbox >/dev/null" };

  if ((m = SCROT.exec(line))) {
    const path = m[1]!;
    return {
      before: async () => {
        const shot = await desktop.screenshot(id);
        await (await ctx.agent()).writeFile(path, shot.png, { mode: 0o600 });
      },
      line: "true",
    };
  }
  if ((m = XDG_OPEN.exec(line))) {
    const target = m[1]!;
    return { before: () => desktop.openUrl(id, target), line: "true" };
  }
  if (line.startsWith("gtk-launch "))
    unsupported(
      "bothy's desktop has no application launcher (gtk-launch): open URLs and files with open(), or start a program with commands.run(..., { background: true }).",
    );

  if ((m = STOREPASSWD.exec(line))) {
    const password = m[1]!;
    return {
      before: async () => streams.setPassword(id, password),
      line: "true",
      recorded: "x11vnc -storepasswd ******** ~/.vnc/passwd",
    };
  }
  if ((m = X11VNC.exec(line))) {
    if (m[1] === "-nopw")
      unsupported(
        "bothy serves a desktop stream only with a password (its sandbox ids are not secrets): call stream.start({ requireAuth: true }) and open stream.getUrl({ authKey: stream.getAuthKey() }).",
      );
    if (m[2] !== undefined)
      unsupported("bothy's desktop stream shows the whole screen: call stream.start() without windowId.");
    // bothy's x11vnc already runs for its own viewer; starting the desktop makes sure of it.
    return {
      before: async () => {
        await desktop.start(id);
      },
      line: "true",
    };
  }
  if ((m = NOVNC.exec(line))) {
    const port = Number(m[1]);
    return {
      before: async () => {
        if (ctx.binding === undefined || !streams.start(id, port, ctx.binding))
          unsupported(
            "Start the stream with stream.start({ requireAuth: true }): bothy serves it only with a password.",
          );
      },
      line: "true",
    };
  }
  if ((m = NETSTAT.exec(line))) {
    const port = Number(m[1]);
    return {
      before: nothing,
      line: streams.isOpen(id, port) ? `echo "tcp 0 0 0.0.0.0:${port} 0.0.0.0:* LISTEN"` : "exit 1",
    };
  }
  // The SDK asks whether its own stream runs; bothy's x11vnc runs whenever the desktop does.
  if (line === "pgrep -x x11vnc") return { before: nothing, line: streams.isOpen(id) ? "pgrep -x x11vnc" : "exit 1" };
  if (line === "pkill x11vnc") return { before: async () => streams.stop(id), line: "true" };
  return undefined;
}
