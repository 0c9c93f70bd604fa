/**
 * A sandbox's lifecycle buttons: pause and resume (QEMU keeps the VM's memory on disk; a gVisor
 * sandbox sleeps by itself when idle and wakes on the next call, so it has no pause button), and
 * when it expires, set again from now. Shown only to a key with sandboxes:write.
 */
import type { SandboxInfo } from "@bothy/protocol";
import { useState } from "preact/hooks";
import { ApiError, sendJson } from "../api.ts";

/** What "Expire in" offers, in hours. */
const HOURS = [1, 4, 24] as const;

export function SandboxControls({ info, onChanged }: { info: SandboxInfo; onChanged: (info: SandboxInfo) => void }) {
  const [hours, setHours] = useState<number>(HOURS[0]);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const act = async (path: string, body?: unknown): Promise<void> => {
    setBusy(true);
    setError(null);
    try {
      onChanged(await sendJson<SandboxInfo>("POST", `/sandboxes/${info.sandbox_id}/${path}`, body));
    } catch (err) {
      setError(err instanceof ApiError ? err.message : String(err));
    } finally {
      setBusy(false);
    }
  };
  const asleep = info.state === "paused" || info.state === "stopped";
  return (
    <div class="actions" aria-label="Lifecycle">
      {info.driver === "qemu" && info.state === "running" && (
        <button type="button" disabled={busy} onClick={() => void act("pause")}>
          Pause
        </button>
      )}
      {asleep && (
        <button type="button" disabled={busy} onClick={() => void act("resume")}>
          Resume
        </button>
      )}
      <label for="expire-hours">Expire in (hours)</label>
      <select
        id="expire-hours"
        value={hours}
        onChange={(ev) => setHours(Number((ev.target as HTMLSelectElement).value))}
      >
        {HOURS.map((h) => (
          <option key={h} value={h}>
            {h}
          </option>
        ))}
      </select>
      <button type="button" disabled={busy} onClick={() => void act("timeout", { timeout_s: hours * 3600 })}>
        Set expiry
      </button>
      {error !== null && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
    </div>
  );
}
