/**
 * The ports a sandbox listens on, each opened through a link the API signs (POST
 * /sandboxes/{id}/port-links/{port}): the session cookie is never a credential on port routes,
 * so the new tab carries the link's token instead, on the preview host where there is one.
 * Minting a link needs sandboxes:write; a reader sees the ports without the buttons.
 */
import type { ListeningPort } from "@bothy/protocol";
import { useEffect, useState } from "preact/hooks";
import { ApiError, getJson, sendJson } from "../api.ts";

export function PortLinks({ sandboxId, writable }: { sandboxId: string; writable: boolean }) {
  const [ports, setPorts] = useState<ListeningPort[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const load = (): void => {
    getJson<{ ports: ListeningPort[] }>(`/sandboxes/${sandboxId}/ports`)
      .then((r) => {
        setPorts(r.ports);
        setError(null);
      })
      .catch((err: unknown) => setError(err instanceof ApiError ? err.message : String(err)));
  };
  useEffect(load, [sandboxId]);
  const open = async (port: number): Promise<void> => {
    // Opened before the link exists, so the browser counts it as the click's own window.
    const tab = window.open("", "_blank");
    try {
      const link = await sendJson<{ url: string; preview_url?: string }>(
        "POST",
        `/sandboxes/${sandboxId}/port-links/${port}`,
        { ttl_s: 3600 },
      );
      if (tab) {
        tab.opener = null;
        tab.location.href = link.preview_url ?? link.url;
      }
    } catch (err) {
      tab?.close();
      setError(err instanceof ApiError ? err.message : String(err));
    }
  };
  return (
    <section aria-labelledby="ports-title">
      <h2 id="ports-title">
        Ports{" "}
        <button type="button" class="quiet" onClick={load}>
          Refresh
        </button>
      </h2>
      {error !== null && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
      {ports !== null && ports.length === 0 && <p class="empty">Nothing listens yet.</p>}
      <ul class="ports">
        {(ports ?? []).map((p) => (
          <li key={p.port}>
            {writable ? (
              <button type="button" class="link" onClick={() => void open(p.port)}>
                Open port {p.port}
              </button>
            ) : (
              <span>Port {p.port}</span>
            )}{" "}
            <span class="status">{p.address}</span>
          </li>
        ))}
      </ul>
    </section>
  );
}
