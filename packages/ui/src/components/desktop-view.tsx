/**
 * The sandbox's screen, live: the noVNC bothy serves (/desktop/novnc/, loaded only with this view)
 * over `GET /sandboxes/{id}/desktop/vnc` as a WebSocket that the session cookie authenticates, on
 * the dashboard's own origin (the server refuses any other Origin), so no key or token is in a URL.
 * View only by default; a key with sandboxes:write may switch on control (mouse and keyboard).
 * The server drops a reader's input whatever the page does (api/rfb-view-only.ts).
 * Connecting starts the desktop when it is not running yet, which takes a while: the desktop
 * template connects on its own, any other sandbox only when asked (most have no desktop).
 */
import { useEffect, useRef, useState } from "preact/hooks";
import { wsUrl } from "../api.ts";
import "./sandbox-parts.css";

/** The part of noVNC's RFB this view uses. */
interface Rfb extends EventTarget {
  viewOnly: boolean;
  scaleViewport: boolean;
  disconnect(): void;
}
type RfbClass = new (target: HTMLElement, url: string, options: { shared: boolean }) => Rfb;

/** Served by the server beside the API (not bundled): the dashboard stays small without it. */
const NOVNC = "/desktop/novnc/core/rfb.js";

export function DesktopView({
  sandboxId,
  template,
  writable,
}: {
  sandboxId: string;
  template: string;
  writable: boolean;
}) {
  const screen = useRef<HTMLDivElement>(null);
  const rfb = useRef<Rfb | null>(null);
  const [wanted, setWanted] = useState(template === "desktop");
  const [status, setStatus] = useState(wanted ? "connecting" : "off");
  const [control, setControl] = useState(false);
  const [attempt, setAttempt] = useState(0);
  useEffect(() => {
    if (!wanted) return;
    let gone = false;
    setStatus("connecting");
    void (import(/* @vite-ignore */ NOVNC) as Promise<{ default: RfbClass }>).then(
      ({ default: RFB }) => {
        if (gone || !screen.current) return;
        const view = new RFB(screen.current, wsUrl(`/sandboxes/${encodeURIComponent(sandboxId)}/desktop/vnc`), {
          shared: true,
        });
        view.viewOnly = true;
        view.scaleViewport = true;
        let connected = false;
        view.addEventListener("connect", () => {
          connected = true;
          setStatus("live");
        });
        view.addEventListener("disconnect", () => {
          if (gone) return;
          setStatus(
            connected
              ? "disconnected"
              : "could not connect: this sandbox may have no desktop (template desktop has one)",
          );
        });
        rfb.current = view;
      },
      (err: unknown) => setStatus(`could not load the viewer: ${String(err)}`),
    );
    return () => {
      gone = true;
      rfb.current?.disconnect();
      rfb.current = null;
    };
  }, [sandboxId, wanted, attempt]);
  useEffect(() => {
    if (rfb.current) rfb.current.viewOnly = !(writable && control);
  }, [control, writable, status]);
  return (
    <section aria-labelledby="desktop-title">
      <h2 id="desktop-title">
        Desktop <span class="status">{status}</span>
      </h2>
      <div class="toolbar">
        {!wanted && (
          <button type="button" onClick={() => setWanted(true)}>
            Connect to the desktop
          </button>
        )}
        {wanted && status !== "live" && status !== "connecting" && (
          <button type="button" class="quiet" onClick={() => setAttempt((n) => n + 1)}>
            Reconnect
          </button>
        )}
        {writable && wanted && (
          <label>
            <input
              type="checkbox"
              checked={control}
              onChange={(ev) => setControl((ev.target as HTMLInputElement).checked)}
            />{" "}
            Control (mouse and keyboard)
          </label>
        )}
      </div>
      {wanted && (
        <div
          class="desktop-screen"
          ref={screen}
          data-status={status}
          aria-label="Live view of the desktop"
          role="img"
        />
      )}
    </section>
  );
}
