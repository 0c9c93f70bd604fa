/** The sandboxes: a list kept live from /events, a filter, the create form and delete. */
import type { SandboxInfo } from "@bothy/protocol";
import { useCallback, useEffect, useMemo, useRef, useState } from "preact/hooks";
import { ApiError, getJson, sendJson } from "../api.ts";
import type { PageProps } from "../app.tsx";
import { CreateForm } from "../components/create-form.tsx";
import { usageText, useUsage } from "../components/usage-cell.ts";
import { onEvents } from "../events.ts";
import { href } from "../router.ts";
import { span } from "../time.ts";
import { ScrollBox } from "../components/scroll-box.tsx";

const LIST_EVENTS = ["sandbox.created", "sandbox.deleted", "sandbox.failed", "sandbox.stopped", "sandbox.woken"];

/**
 * The live sandboxes, fetched again whenever an event says the set or a state changed. One fetch
 * at a time: events that come while one is out ask for one more after it, so a burst of them costs
 * two fetches, and an older answer never lands over a newer one.
 */
export function useSandboxes(): { sandboxes: SandboxInfo[] | null; error: string | null; reload: () => void } {
  const [sandboxes, setSandboxes] = useState<SandboxInfo[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const fetching = useRef<"idle" | "out" | "again">("idle");
  const reload = useCallback(function fetchList(): void {
    if (fetching.current !== "idle") {
      fetching.current = "again";
      return;
    }
    fetching.current = "out";
    getJson<{ sandboxes: SandboxInfo[] }>("/sandboxes")
      .then((r) => {
        setSandboxes(r.sandboxes);
        setError(null);
      })
      .catch((err: unknown) => setError(err instanceof ApiError ? err.message : String(err)))
      .finally(() => {
        const again = fetching.current === "again";
        fetching.current = "idle";
        if (again) fetchList();
      });
  }, []);
  useEffect(() => {
    reload();
    return onEvents(LIST_EVENTS, reload);
  }, [reload]);
  return { sandboxes, error, reload };
}

export function SandboxesPage({ can }: PageProps) {
  const { sandboxes, error, reload } = useSandboxes();
  const usage = useUsage();
  const [filter, setFilter] = useState("");
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), 5000);
    return () => clearInterval(timer);
  }, []);
  const shown = useMemo(() => {
    const words = filter.toLowerCase().split(/\s+/).filter(Boolean);
    return (sandboxes ?? []).filter((s) => {
      const text = [s.sandbox_id, s.state, s.template, s.driver, ...Object.values(s.metadata)].join(" ").toLowerCase();
      return words.every((w) => text.includes(w));
    });
  }, [sandboxes, filter]);
  const remove = async (id: string): Promise<void> => {
    try {
      await sendJson("DELETE", `/sandboxes/${id}`);
    } catch (err) {
      alert(err instanceof ApiError ? err.message : String(err));
    }
    reload();
  };
  const writable = can("sandboxes:write");
  return (
    <>
      <h1>Sandboxes</h1>
      {writable && <CreateForm onCreated={reload} />}
      <div class="toolbar">
        <label for="filter">Filter</label>
        <input
          id="filter"
          type="search"
          placeholder="id, state, template, driver, label"
          value={filter}
          onInput={(ev) => setFilter((ev.target as HTMLInputElement).value)}
        />
        <span aria-live="polite" class="count">
          {sandboxes === null ? "" : `${shown.length} of ${sandboxes.length}`}
        </span>
      </div>
      {error !== null && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
      <ScrollBox label="Sandboxes">
        <table class="list">
          <thead>
            <tr>
              <th scope="col">Sandbox</th>
              <th scope="col">State</th>
              <th scope="col">Template</th>
              <th scope="col">Driver</th>
              <th scope="col">Size</th>
              <th scope="col">Metadata</th>
              <th scope="col">Usage</th>
              <th scope="col">Age</th>
              <th scope="col">Expires in</th>
              {writable && <th scope="col">Actions</th>}
            </tr>
          </thead>
          <tbody>
            {shown.map((s) => (
              <tr key={s.sandbox_id} data-sandbox={s.sandbox_id}>
                <td>
                  <a href={href("sandbox", s.sandbox_id)}>{s.sandbox_id}</a>
                </td>
                <td>
                  <span class={`state state-${s.state}`}>{s.state}</span>
                </td>
                <td>{s.template}</td>
                <td>{s.driver}</td>
                <td>
                  {s.vcpu} vCPU · {s.memory_mib} MiB
                </td>
                <td class="meta-cell">
                  {Object.entries(s.metadata)
                    .map(([k, v]) => (v === "" ? k : `${k}=${v}`))
                    .join(" ")}
                </td>
                <td data-usage>{usageText(usage.get(s.sandbox_id))}</td>
                <td>{span(now - Date.parse(s.created_at))}</td>
                <td>{s.expires_at === null ? "never" : span(Date.parse(s.expires_at) - now)}</td>
                {writable && (
                  <td>
                    <button
                      type="button"
                      class="danger"
                      aria-label={`Delete ${s.sandbox_id}`}
                      onClick={() => void remove(s.sandbox_id)}
                    >
                      Delete
                    </button>
                  </td>
                )}
              </tr>
            ))}
          </tbody>
        </table>
      </ScrollBox>
      {sandboxes !== null && sandboxes.length === 0 && <p class="empty">No sandboxes yet.</p>}
    </>
  );
}
