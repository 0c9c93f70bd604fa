/**
 * A sandbox's commands, running and past (GET /sandboxes/{id}/commands, again on each
 * `command.exited`), with a form that starts one in the background and a view that re-attaches to
 * any of them (command-output.tsx). Starting, attaching and killing go over WebSockets, which need
 * sandboxes:write: a key without it sees the list only.
 */
import type { CommandEvent, CommandInfo } from "@bothy/protocol";
import { useCallback, useEffect, useState } from "preact/hooks";
import { ApiError, getJson, wsUrl } from "../api.ts";
import { onEvents } from "../events.ts";
import { CommandOutput } from "./command-output.tsx";
import "./sandbox-parts.css";

/** The newest commands shown; a sandbox that ran thousands keeps the page light. */
const SHOWN = 100;

/** How long a background command may run when the form starts it (the API's maximum). */
const BACKGROUND_TIMEOUT_S = 86400;

/**
 * Starts `cmd` in the background on a socket of its own and answers its id once `started` comes;
 * the socket is then closed, which leaves a background command running.
 */
function startBackground(sandboxId: string, cmd: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(wsUrl(`/sandboxes/${encodeURIComponent(sandboxId)}/command`));
    let done = false;
    const finish = (err: Error | undefined, id?: string): void => {
      if (done) return;
      done = true;
      ws.close();
      if (err) reject(err);
      else resolve(id!);
    };
    ws.onopen = () => ws.send(JSON.stringify({ cmd, background: true, timeout_s: BACKGROUND_TIMEOUT_S }));
    ws.onmessage = (ev) => {
      const frame = JSON.parse(String(ev.data)) as CommandEvent;
      if (frame.type === "started") finish(undefined, frame.command_id);
      else if (frame.type === "error") finish(new ApiError(frame.message, frame.code, 0));
    };
    ws.onclose = () => finish(new Error("The command socket closed before the command started; try again."));
  });
}

export function CommandsPanel({ sandboxId, writable }: { sandboxId: string; writable: boolean }) {
  const [commands, setCommands] = useState<CommandInfo[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [cmd, setCmd] = useState("");
  const [attached, setAttached] = useState<string | null>(null);
  const load = useCallback(() => {
    getJson<{ commands: CommandInfo[] }>(`/sandboxes/${encodeURIComponent(sandboxId)}/commands`)
      .then((r) => {
        setCommands(r.commands);
        setError(null);
      })
      .catch((err: unknown) => setError(err instanceof ApiError ? err.message : String(err)));
  }, [sandboxId]);
  useEffect(() => {
    load();
    return onEvents(["command.exited"], (_type, data) => {
      if ((data as { sandbox_id?: string }).sandbox_id === sandboxId) load();
    });
  }, [load, sandboxId]);

  const run = async (ev: Event): Promise<void> => {
    ev.preventDefault();
    setError(null);
    try {
      const id = await startBackground(sandboxId, cmd);
      setAttached(id);
      setCmd("");
    } catch (err) {
      setError(err instanceof Error ? err.message : String(err));
    }
    load();
  };
  const newest = [...(commands ?? [])].reverse().slice(0, SHOWN);
  return (
    <section aria-labelledby="commands-title">
      <h2 id="commands-title">
        Commands{" "}
        <button type="button" class="quiet" onClick={load}>
          Reload commands
        </button>
      </h2>
      {writable && (
        <form class="toolbar" onSubmit={(ev) => void run(ev)}>
          <label for="background-cmd">Command</label>
          <input
            id="background-cmd"
            class="wide"
            value={cmd}
            required
            placeholder="npm run dev"
            onInput={(ev) => setCmd((ev.target as HTMLInputElement).value)}
          />
          <button type="submit">Run in background</button>
        </form>
      )}
      {error !== null && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
      {attached !== null && (
        <CommandOutput key={attached} sandboxId={sandboxId} commandId={attached} writable={writable} onEnded={load} />
      )}
      {commands !== null && commands.length === 0 && <p class="empty">No commands yet.</p>}
      {commands !== null && commands.length > SHOWN && (
        <p class="hint">
          The newest {SHOWN} of {commands.length} commands.
        </p>
      )}
      {newest.length > 0 && (
        <table class="list commands" aria-label="Commands">
          <thead>
            <tr>
              <th scope="col">Command</th>
              <th scope="col">State</th>
              <th scope="col">Exit</th>
              <th scope="col">Started</th>
              {writable && <th scope="col">Output</th>}
            </tr>
          </thead>
          <tbody>
            {newest.map((c) => (
              <tr key={c.command_id} data-command={c.command_id} data-state={c.state}>
                <td>
                  <code class="cmd" title={c.cmd}>
                    {c.cmd}
                  </code>
                  {c.background && <span class="tag">background</span>}
                </td>
                <td>{c.state}</td>
                <td data-exit>{c.signal ?? c.exit_code ?? ""}</td>
                <td>
                  <time dateTime={c.started_at}>{new Date(c.started_at).toLocaleTimeString()}</time>
                </td>
                {writable && (
                  <td>
                    {c.state === "running" || c.state === "exited" ? (
                      <button
                        type="button"
                        class="quiet"
                        aria-label={`${c.state === "running" ? "Attach" : "Replay"} ${c.command_id}`}
                        onClick={() => setAttached(c.command_id)}
                      >
                        {c.state === "running" ? "Attach" : "Replay"}
                      </button>
                    ) : null}
                  </td>
                )}
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}
