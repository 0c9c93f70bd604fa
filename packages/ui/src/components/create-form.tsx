/** The create form: template, size and network; POST /sandboxes. */
import type { SandboxInfo } from "@bothy/protocol";
import { useState } from "preact/hooks";
import { ApiError, sendJson } from "../api.ts";

const SIZES = {
  small: { vcpu: 1, memory_mib: 512 },
  medium: { vcpu: 2, memory_mib: 1024 },
  large: { vcpu: 2, memory_mib: 2048 },
} as const;

/** "default" leaves it to the server (no network at all where BOTHY_NETWORK=off). */
const NETWORKS = {
  default: { label: "server default", body: {} },
  internet: { label: "internet (public addresses)", body: { internet: true } },
  none: { label: "none", body: { internet: false } },
} as const;

export function CreateForm({ onCreated }: { onCreated: (sandbox: SandboxInfo) => void }) {
  const [template, setTemplate] = useState("seed");
  const [size, setSize] = useState<keyof typeof SIZES>("small");
  const [network, setNetwork] = useState<keyof typeof NETWORKS>("default");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const submit = async (ev: Event): Promise<void> => {
    ev.preventDefault();
    setBusy(true);
    setError(null);
    try {
      onCreated(
        await sendJson<SandboxInfo>("POST", "/sandboxes", { template, ...SIZES[size], ...NETWORKS[network].body }),
      );
    } catch (err) {
      setError(err instanceof ApiError ? err.message : String(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="create" aria-label="Create a sandbox" onSubmit={(ev) => void submit(ev)}>
      <label>
        Template
        <input
          name="template"
          value={template}
          onInput={(ev) => setTemplate((ev.target as HTMLInputElement).value)}
          required
        />
      </label>
      <label>
        Size
        <select
          name="size"
          value={size}
          onChange={(ev) => setSize((ev.target as HTMLSelectElement).value as keyof typeof SIZES)}
        >
          {Object.entries(SIZES).map(([name, s]) => (
            <option key={name} value={name}>
              {name} ({s.vcpu} vCPU, {s.memory_mib} MiB)
            </option>
          ))}
        </select>
      </label>
      <label>
        Network
        <select
          name="network"
          value={network}
          onChange={(ev) => setNetwork((ev.target as HTMLSelectElement).value as keyof typeof NETWORKS)}
        >
          {Object.entries(NETWORKS).map(([name, n]) => (
            <option key={name} value={name}>
              {n.label}
            </option>
          ))}
        </select>
      </label>
      <button type="submit" disabled={busy}>
        {busy ? "Creating…" : "Create sandbox"}
      </button>
      {error !== null && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
    </form>
  );
}
