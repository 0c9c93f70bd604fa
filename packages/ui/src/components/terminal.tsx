/**
 * A live shell in the sandbox: xterm.js over the command WebSocket (`pty`), the cookie
 * authenticating the upgrade. Keys go in as `stdin`, the terminal's size as `resize` whenever the
 * element changes size; the shell's output (bytes, base64 on the wire when not UTF-8) is written
 * as it comes. xterm.js is loaded with this view only, so the other pages stay small. Tab belongs to
 * the shell (completion), so Escape then Tab (or Shift+Tab) leaves the terminal: a keyboard alone
 * is never held in it. It takes focus only when asked (a click, or Tab), never by itself.
 */
import type { CommandEvent } from "@bothy/protocol";
import { useEffect, useRef, useState } from "preact/hooks";
import { wsUrl } from "../api.ts";

const HINT_ID = "terminal-keys";
const SHELL = "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi";

function bytesOf(data: string, encoding: string | undefined): Uint8Array | string {
  if (encoding !== "base64") return data;
  return Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
}

export function TerminalView({ sandboxId, writable }: { sandboxId: string; writable: boolean }) {
  const box = useRef<HTMLDivElement>(null);
  const [status, setStatus] = useState("connecting");
  useEffect(() => {
    let stop: (() => void) | undefined;
    let cancelled = false;
    void Promise.all([import("@xterm/xterm"), import("@xterm/addon-fit"), import("@xterm/xterm/css/xterm.css")]).then(
      ([{ Terminal }, { FitAddon }]) => {
        if (!cancelled) stop = start(Terminal, FitAddon);
      },
    );
    return () => {
      cancelled = true;
      stop?.();
    };
  }, [sandboxId, writable]);

  function start(
    Terminal: typeof import("@xterm/xterm").Terminal,
    FitAddon: typeof import("@xterm/addon-fit").FitAddon,
  ) {
    const term = new Terminal({ convertEol: false, cursorBlink: true, fontSize: 14, disableStdin: !writable });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(box.current!);
    term.textarea?.setAttribute("aria-describedby", HINT_ID);
    // Escape goes to the shell as ever; a Tab right after it is left to the browser, which moves focus on.
    let leaving = false;
    term.attachCustomKeyEventHandler((ev) => {
      if (ev.type !== "keydown") return true;
      if (ev.key === "Tab" && leaving) {
        leaving = false;
        return false;
      }
      leaving = ev.key === "Escape";
      return true;
    });
    fit.fit();
    const ws = new WebSocket(wsUrl(`/sandboxes/${sandboxId}/command`));
    const send = (frame: object): void => {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(frame));
    };
    ws.onopen = () => {
      ws.send(JSON.stringify({ cmd: SHELL, pty: { cols: term.cols, rows: term.rows }, timeout_s: 86400 }));
      setStatus("connected");
    };
    ws.onmessage = (ev) => {
      const frame = JSON.parse(String(ev.data)) as CommandEvent;
      if (frame.type === "stdout" || frame.type === "stderr") term.write(bytesOf(frame.data, frame.encoding));
      else if (frame.type === "process_exited") setStatus(`exited (${frame.exit_code ?? frame.signal ?? "?"})`);
      else if (frame.type === "error") term.write(`\r\n[${frame.code}] ${frame.message}\r\n`);
    };
    ws.onclose = () => setStatus((s) => (s.startsWith("exited") ? s : "disconnected"));
    const input = term.onData((data) => send({ type: "stdin", data }));
    const resized = term.onResize(({ cols, rows }) => send({ type: "resize", cols, rows }));
    const observer = new ResizeObserver(() => fit.fit());
    observer.observe(box.current!);
    return () => {
      observer.disconnect();
      input.dispose();
      resized.dispose();
      ws.close();
      term.dispose();
    };
  }
  return (
    <section aria-label="Terminal">
      <h2>
        Terminal <span class="status">{status}</span>
      </h2>
      <div class="term-box" ref={box} data-status={status} data-focus-ring />
      <p class="hint" id={HINT_ID}>
        Tab completes in the shell; Esc then Tab leaves the terminal.
      </p>
    </section>
  );
}
