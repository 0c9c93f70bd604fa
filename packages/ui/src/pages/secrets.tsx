/**
 * The vault's secrets (scope secrets): names, the hosts each may be sent to and how it is
 * injected; create, rotate (a new value under the same name) and delete. Values are write-only:
 * the API never answers with one, and the value field is emptied as soon as it is sent (on
 * success or not), so no value stays in the page.
 */
import type { SecretInfo } from "@bothy/protocol";
import { useRef, useState } from "preact/hooks";
import { getJson, sendJson } from "../api.ts";
import type { PageProps } from "../app.tsx";
import { ErrorLine, useLoad } from "../use-load.tsx";
import { ScrollBox } from "../components/scroll-box.tsx";

interface Draft {
  name: string;
  hosts: string;
  header: string;
  format: string;
  /** Set when rotating a listed secret: its name and tenant are fixed. */
  tenant: string | null;
}

const EMPTY: Draft = { name: "", hosts: "", header: "", format: "{value}", tenant: null };
const words = (s: string): string[] => s.split(/[\s,]+/).filter(Boolean);
const query = (tenant: string | null): string => (tenant === null ? "" : `?tenant=${encodeURIComponent(tenant)}`);

export function SecretsPage(_: PageProps) {
  const secrets = useLoad(() => getJson<{ secrets: SecretInfo[] }>("/secrets").then((r) => r.secrets));
  const [draft, setDraft] = useState<Draft>(EMPTY);
  const [done, setDone] = useState<string | null>(null);
  // The value lives only in the field itself (uncontrolled): never in component state, and cleared on send.
  const valueRef = useRef<HTMLInputElement>(null);
  const set = (patch: Partial<Draft>): void => setDraft({ ...draft, ...patch });
  const save = async (ev: Event): Promise<void> => {
    ev.preventDefault();
    const field = valueRef.current!;
    const value = field.value;
    field.value = "";
    const body = {
      value,
      hosts: words(draft.hosts),
      ...(draft.header.trim() === "" ? {} : { inject: { header: draft.header.trim(), format: draft.format } }),
    };
    try {
      await sendJson("PUT", `/secrets/${encodeURIComponent(draft.name)}${query(draft.tenant)}`, body);
      setDone(`${draft.tenant === null ? "Stored" : "Rotated"} ${draft.name}; its value cannot be read back.`);
      setDraft(EMPTY);
      secrets.clearError();
      secrets.reload();
    } catch (err) {
      secrets.fail(err);
    }
  };
  const rotate = (s: SecretInfo): void => {
    setDraft({
      name: s.name,
      hosts: s.hosts.join(" "),
      header: s.inject?.header ?? "",
      format: s.inject?.format ?? "{value}",
      tenant: s.tenant,
    });
    setDone(null);
    valueRef.current?.focus();
  };
  const remove = async (s: SecretInfo): Promise<void> => {
    try {
      await sendJson("DELETE", `/secrets/${encodeURIComponent(s.name)}${query(s.tenant)}`);
      setDone(`Deleted ${s.name}.`);
      secrets.reload();
    } catch (err) {
      secrets.fail(err);
    }
  };
  const rotating = draft.tenant !== null;
  return (
    <>
      <h1>Secrets</h1>
      <p class="hint">
        Sandboxes see a placeholder; the egress gateway swaps in the value only on requests to the hosts named.
      </p>
      <ErrorLine error={secrets.error} />
      {done !== null && <p role="status">{done}</p>}
      <form
        class="create"
        aria-label={rotating ? `Rotate ${draft.name}` : "Store a secret"}
        autocomplete="off"
        onSubmit={(ev) => void save(ev)}
      >
        <label>
          Name
          <input
            name="name"
            required
            pattern="[a-z][a-z0-9_]{0,62}"
            title="lower-case letters, digits and _"
            readOnly={rotating}
            value={draft.name}
            onInput={(ev) => set({ name: (ev.target as HTMLInputElement).value })}
          />
        </label>
        <label>
          Value
          <input ref={valueRef} name="value" type="password" required autocomplete="new-password" />
        </label>
        <label>
          Hosts
          <input
            name="hosts"
            required
            placeholder="api.example.com *.example.com"
            value={draft.hosts}
            onInput={(ev) => set({ hosts: (ev.target as HTMLInputElement).value })}
          />
        </label>
        <label>
          Inject as header
          <input
            name="header"
            placeholder="(the sandbox places it)"
            value={draft.header}
            onInput={(ev) => set({ header: (ev.target as HTMLInputElement).value })}
          />
        </label>
        <label>
          Header format
          <input
            name="format"
            value={draft.format}
            onInput={(ev) => set({ format: (ev.target as HTMLInputElement).value })}
          />
        </label>
        <button type="submit">{rotating ? `Save new value of ${draft.name}` : "Store secret"}</button>
        {rotating && (
          <button type="button" class="quiet" onClick={() => setDraft(EMPTY)}>
            Cancel
          </button>
        )}
      </form>
      <ScrollBox label="Secrets">
        <table class="list">
          <thead>
            <tr>
              <th scope="col">Name</th>
              <th scope="col">Tenant</th>
              <th scope="col">Hosts</th>
              <th scope="col">Injection</th>
              <th scope="col">Updated</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {(secrets.data ?? []).map((s) => (
              <tr key={`${s.tenant}/${s.name}`} data-secret={s.name}>
                <td>{s.name}</td>
                <td>{s.tenant}</td>
                <td>{s.hosts.join(" ")}</td>
                <td>
                  {s.inject === null
                    ? "placeholder, where the sandbox puts it"
                    : `${s.inject.header}: ${s.inject.format}`}
                </td>
                <td>{s.updated_at}</td>
                <td class="row-actions">
                  <button type="button" class="quiet" onClick={() => rotate(s)}>
                    Rotate {s.name}
                  </button>
                  <button type="button" class="danger" onClick={() => void remove(s)}>
                    Delete {s.name}
                  </button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </ScrollBox>
      {secrets.data?.length === 0 && <p class="empty">No secrets yet.</p>}
    </>
  );
}
