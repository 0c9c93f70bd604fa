/**
 * Tenants (scope admin): each with its quotas beside what it uses now, a quota edited in place
 * (an empty field lifts that limit), a new tenant, and deleting one that holds nothing (the server
 * refuses one that still has sandboxes, keys or data, in words shown on the page). GET/POST
 * /tenants, PATCH /tenants/{id}/quota, DELETE /tenants/{id}.
 */
import type { TenantQuota } from "@bothy/protocol";
import { useState } from "preact/hooks";
import { getJson, sendJson } from "../api.ts";
import type { PageProps } from "../app.tsx";
import { ErrorLine, useLoad } from "../use-load.tsx";
import { ScrollBox } from "../components/scroll-box.tsx";

interface TenantView {
  tenant: string;
  quota: TenantQuota;
  created_at: string;
  live: { sandboxes: number; vcpu: number; memory_mib: number };
}

type QuotaKey = keyof TenantQuota;

/** Every quota the API knows, in the order the table shows them, with what a person reads. */
export const QUOTA_FIELDS: ReadonlyArray<{ key: QuotaKey; label: string; whole: boolean }> = [
  { key: "max_sandboxes", label: "Max sandboxes", whole: true },
  { key: "max_vcpu", label: "Max vCPU", whole: true },
  { key: "max_memory_mib", label: "Max memory (MiB)", whole: true },
  { key: "max_storage_mib", label: "Max storage (MiB)", whole: true },
  { key: "creates_per_minute", label: "Creates per minute", whole: true },
  { key: "monthly_vcpu_hours", label: "vCPU hours a month", whole: false },
  { key: "monthly_gib_hours", label: "GiB hours a month", whole: false },
];

const limit = (v: number | null | undefined): string => (v == null ? "∞" : String(v));
/** The server's own tenant, which it never deletes: no button that would fail. */
const OWN_TENANT = "default";

export function TenantsPage(_: PageProps) {
  const tenants = useLoad(() => getJson<{ tenants: TenantView[] }>("/tenants").then((r) => r.tenants));
  const [editing, setEditing] = useState<string | null>(null);
  const [name, setName] = useState("");
  const [done, setDone] = useState<string | null>(null);
  const create = async (ev: Event): Promise<void> => {
    ev.preventDefault();
    try {
      await sendJson("POST", "/tenants", { tenant: name });
      setName("");
      setEditing(name);
      tenants.reload();
    } catch (err) {
      tenants.fail(err);
    }
  };
  const remove = async (tenant: string): Promise<void> => {
    setDone(null);
    try {
      await sendJson("DELETE", `/tenants/${encodeURIComponent(tenant)}`);
      if (editing === tenant) setEditing(null);
      setDone(`Deleted tenant ${tenant}.`);
      tenants.reload();
    } catch (err) {
      tenants.fail(err);
    }
  };
  return (
    <>
      <h1>Tenants</h1>
      <ErrorLine error={tenants.error} />
      {done !== null && <p role="status">{done}</p>}
      <form class="create" aria-label="Create a tenant" onSubmit={(ev) => void create(ev)}>
        <label>
          New tenant
          <input
            name="tenant"
            required
            pattern="[a-z0-9][a-z0-9\-]{0,62}"
            title="lower-case letters, digits and -"
            value={name}
            onInput={(ev) => setName((ev.target as HTMLInputElement).value)}
          />
        </label>
        <button type="submit">Create tenant</button>
      </form>
      <ScrollBox label="Tenants and quotas">
        <table class="list">
          <thead>
            <tr>
              <th scope="col">Tenant</th>
              <th scope="col">Sandboxes</th>
              <th scope="col">vCPU</th>
              <th scope="col">Memory MiB</th>
              <th scope="col">Other quotas</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {(tenants.data ?? []).map((t) => (
              <tr key={t.tenant} data-tenant={t.tenant}>
                <td>{t.tenant}</td>
                <td>
                  {t.live.sandboxes} / {limit(t.quota.max_sandboxes)}
                </td>
                <td>
                  {t.live.vcpu} / {limit(t.quota.max_vcpu)}
                </td>
                <td>
                  {t.live.memory_mib} / {limit(t.quota.max_memory_mib)}
                </td>
                <td class="meta-cell">
                  {QUOTA_FIELDS.filter((f) => !["max_sandboxes", "max_vcpu", "max_memory_mib"].includes(f.key))
                    .map((f) => `${f.label.toLowerCase()}: ${limit(t.quota[f.key])}`)
                    .join(" · ")}
                </td>
                <td>
                  <button
                    type="button"
                    class="quiet"
                    aria-expanded={editing === t.tenant}
                    onClick={() => setEditing(editing === t.tenant ? null : t.tenant)}
                  >
                    Edit quotas of {t.tenant}
                  </button>
                  {t.tenant !== OWN_TENANT && (
                    <button type="button" class="danger" onClick={() => void remove(t.tenant)}>
                      Delete {t.tenant}
                    </button>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </ScrollBox>
      {editing !== null && tenants.data?.some((t) => t.tenant === editing) && (
        <QuotaForm
          key={editing}
          tenant={tenants.data.find((t) => t.tenant === editing)!}
          onSaved={() => {
            setEditing(null);
            tenants.reload();
          }}
          onError={tenants.fail}
        />
      )}
    </>
  );
}

function QuotaForm(props: { tenant: TenantView; onSaved: () => void; onError: (err: unknown) => void }) {
  const { tenant, quota } = props.tenant;
  const [values, setValues] = useState<Record<QuotaKey, string>>(
    () =>
      Object.fromEntries(QUOTA_FIELDS.map((f) => [f.key, quota[f.key]?.toString() ?? ""])) as Record<QuotaKey, string>,
  );
  const save = async (ev: Event): Promise<void> => {
    ev.preventDefault();
    // Every field is sent: an empty one as null, which lifts that limit.
    const change = Object.fromEntries(
      QUOTA_FIELDS.map((f) => [f.key, values[f.key].trim() === "" ? null : Number(values[f.key])]),
    );
    try {
      await sendJson("PATCH", `/tenants/${encodeURIComponent(tenant)}/quota`, change);
      props.onSaved();
    } catch (err) {
      props.onError(err);
    }
  };
  return (
    <form class="create quota" aria-label={`Quotas of ${tenant}`} onSubmit={(ev) => void save(ev)}>
      <h2>Quotas of {tenant}</h2>
      <p class="hint">An empty field is no limit (the host's own limits still hold).</p>
      <div class="more-fields">
        {QUOTA_FIELDS.map((f) => (
          <label key={f.key}>
            {f.label}
            <input
              name={f.key}
              type="number"
              min={f.whole ? 1 : 0.001}
              step={f.whole ? 1 : "any"}
              inputMode={f.whole ? "numeric" : "decimal"}
              value={values[f.key]}
              onInput={(ev) => setValues({ ...values, [f.key]: (ev.target as HTMLInputElement).value })}
            />
          </label>
        ))}
      </div>
      <button type="submit">Save quotas</button>
    </form>
  );
}
