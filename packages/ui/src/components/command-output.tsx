/**
 * One command's output, re-attached over `GET /sandboxes/{id}/commands/{command_id}` as a
 * WebSocket (the cookie authenticates the upgrade): what the server's replay buffer kept first,
 * then live until it ends. Leaving the page only closes this socket: a background command runs on.
 * The text kept here is bounded (the last OUTPUT_CHARS characters), as the server's buffer is.
 */
import type { CommandEvent } from "@bothy/protocol";
import { useEffect, useRef, useState } from "preact/hooks";
import { wsUrl } from "../api.ts";

/** How much output the view keeps; older text is cut from the top and the cut is said. */
export const OUTPUT_CHARS = 64 * 1024;

export interface CommandView {
  output: string;
  /** Earlier output was cut: here (past OUTPUT_CHARS) or by the server's replay buffer (`dropped` bytes). */
  cut: boolean;
  dropped?: number;
  status: string;
  /** Sends a signal on this socket (a re-attached socket may signal its command). */
  signal: ((name: "SIGINT" | "SIGTERM" | "SIGKILL") => void) | undefined;
}

/** Bytes of a frame as text: base64 frames (not UTF-8 on their own) through one streaming decoder. */
function textOf(frame: { data: string; encoding?: string | undefined }, decoder: TextDecoder): string {
  if (frame.encoding !== "base64") return frame.data;
  return decoder.decode(
    Uint8Array.from(atob(frame.data), (c) => c.charCodeAt(0)),
    { stream: true },
  );
}

export function useCommandOutput(sandboxId: string, commandId: string, onEnded: () => void): CommandView {
  const [view, setView] = useState<CommandView>({ output: "", cut: false, status: "connecting", signal: undefined });
  const ended = useRef(onEnded);
  ended.current = onEnded;
  useEffect(() => {
    const ws = new WebSocket(
      wsUrl(`/sandboxes/${encodeURIComponent(sandboxId)}/commands/${encodeURIComponent(commandId)}`),
    );
    const decoder = new TextDecoder();
    const signal = (name: "SIGINT" | "SIGTERM" | "SIGKILL"): void => {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "signal", signal: name }));
    };
    let over = false;
    ws.onopen = () => setView((v) => ({ ...v, status: "live", signal }));
    ws.onmessage = (ev) => {
      const frame = JSON.parse(String(ev.data)) as CommandEvent;
      if (frame.type === "stdout" || frame.type === "stderr") {
        const more = textOf(frame, decoder);
        setView((v) => {
          const all = v.output + more;
          return all.length > OUTPUT_CHARS
            ? { ...v, output: all.slice(-OUTPUT_CHARS), cut: true }
            : { ...v, output: all };
        });
      } else if (frame.type === "output_dropped") {
        setView((v) => ({ ...v, cut: true, dropped: frame.bytes }));
      } else if (frame.type === "process_exited") {
        over = true;
        const how = frame.signal ? `killed by ${frame.signal}` : `exited ${frame.exit_code ?? "?"}`;
        setView((v) => ({ ...v, status: how, signal: undefined }));
        ended.current();
      } else if (frame.type === "error") {
        over = true;
        setView((v) => ({ ...v, status: `error: ${frame.message}`, signal: undefined }));
        ended.current();
      }
    };
    ws.onclose = () => {
      if (!over) setView((v) => ({ ...v, status: "disconnected", signal: undefined }));
    };
    return () => ws.close();
  }, [sandboxId, commandId]);
  return view;
}

export function CommandOutput({
  sandboxId,
  commandId,
  writable,
  onEnded,
}: {
  sandboxId: string;
  commandId: string;
  writable: boolean;
  onEnded: () => void;
}) {
  const view = useCommandOutput(sandboxId, commandId, onEnded);
  return (
    <div class="command-output" data-command={commandId} data-status={view.status}>
      <p>
        Output of <code>{commandId}</code>: <span class="status">{view.status}</span>{" "}
        {writable && view.signal && (
          <button type="button" class="danger" onClick={() => view.signal?.("SIGKILL")}>
            Kill {commandId}
          </button>
        )}
      </p>
      {view.cut && (
        <p class="hint">
          Earlier output is cut
          {view.dropped === undefined ? "" : ` (the server kept only the latest; ${view.dropped} bytes before it)`}:
          this view keeps the last {OUTPUT_CHARS / 1024} KiB.
        </p>
      )}
      <pre role="log" aria-label={`Output of ${commandId}`} tabIndex={0}>
        {view.output}
      </pre>
    </div>
  );
}
