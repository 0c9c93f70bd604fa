/**
 * The create form: template, size, network, host policy (hosts to ask about, allow and deny, and
 * what happens to the rest), vault secrets by name and metadata; POST /sandboxes. The server
 * checks every field and answers what is wrong in words, shown under the form.
 */
import type { CreateSandboxRequest, HostPolicyRequest, SandboxInfo } from "@bothy/protocol";
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

/** Words of a free-text field: split on commas and white space. */
const words = (text: string): string[] => text.split(/[\s,]+/).filter(Boolean);

/** The policy the host fields describe; undefined when they are all empty. */
function policyOf(f: { ask: string; allow: string; deny: string; otherwise: string }): HostPolicyRequest | undefined {
  const ask = words(f.ask).map((host) => ({ host, action: "ask" as const }));
  const allow = words(f.allow);
  const deny = words(f.deny);
  if (ask.length + allow.length + deny.length === 0 && f.otherwise === "") return undefined;
  return {
    ...(ask.length > 0 ? { rules: ask } : {}),
    ...(allow.length > 0 ? { allow_hosts: allow } : {}),
    ...(deny.length > 0 ? { deny_hosts: deny } : {}),
    ...(f.otherwise === "" ? {} : { default: f.otherwise as "allow" | "deny" | "ask" }),
  };
}

/** `team=web run=42` as metadata; a word without `=` is sent as a key with an empty value (the server says if it is not allowed). */
function metadataOf(text: string): Record<string, string> | undefined {
  const pairs = words(text).map((w) => {
    const eq = w.indexOf("=");
    return eq < 0 ? [w, ""] : [w.slice(0, eq), w.slice(eq + 1)];
  });
  return pairs.length > 0 ? Object.fromEntries(pairs) : undefined;
}

export function CreateForm({ onCreated }: { onCreated: (sandbox: SandboxInfo) => void }) {
  const [template, setTemplate] = useState("seed");
  const [size, setSize] = useState<keyof typeof SIZES>("small");
  const [network, setNetwork] = useState<keyof typeof NETWORKS>("default");
  const [hosts, setHosts] = useState({ ask: "", allow: "", deny: "", otherwise: "" });
  const [secrets, setSecrets] = useState("");
  const [metadata, setMetadata] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const submit = async (ev: Event): Promise<void> => {
    ev.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const policy = policyOf(hosts);
      const meta = metadataOf(metadata);
      const body: CreateSandboxRequest = {
        template,
        ...SIZES[size],
        ...NETWORKS[network].body,
        ...(policy ? { policy } : {}),
        ...(words(secrets).length > 0 ? { secrets: words(secrets) } : {}),
        ...(meta ? { metadata: meta } : {}),
      };
      onCreated(await sendJson<SandboxInfo>("POST", "/sandboxes", body));
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
      <details class="more">
        <summary>Host policy, secrets, metadata</summary>
        <div class="more-fields">
          {(["ask", "allow", "deny"] as const).map((k) => (
            <label key={k}>
              {k === "ask" ? "Ask about hosts" : k === "allow" ? "Allow hosts" : "Deny hosts"}
              <input
                name={`${k}-hosts`}
                placeholder="api.example.com *.example.org"
                value={hosts[k]}
                onInput={(ev) => setHosts({ ...hosts, [k]: (ev.target as HTMLInputElement).value })}
              />
            </label>
          ))}
          <label>
            Other hosts
            <select
              name="otherwise"
              value={hosts.otherwise}
              onChange={(ev) => setHosts({ ...hosts, otherwise: (ev.target as HTMLSelectElement).value })}
            >
              <option value="">policy default</option>
              <option value="allow">allow</option>
              <option value="ask">ask</option>
              <option value="deny">deny</option>
            </select>
          </label>
          <label>
            Secrets (names)
            <input
              name="secrets"
              placeholder="github openai"
              value={secrets}
              onInput={(ev) => setSecrets((ev.target as HTMLInputElement).value)}
            />
          </label>
          <label>
            Metadata
            <input
              name="metadata"
              placeholder="team=web run=42"
              value={metadata}
              onInput={(ev) => setMetadata((ev.target as HTMLInputElement).value)}
            />
          </label>
        </div>
      </details>
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
