/**
 * A sandbox's audit: the egress gateway's decisions and the secrets it used, by name (values never
 * reach an event), newest last; live from /events.
 */
import { AUDIT_EVENT_TYPES, type BothyEvent } from "@bothy/protocol";
import { useEffect, useState } from "preact/hooks";
import { ApiError, getJson } from "../api.ts";
import { onEvents } from "../events.ts";

/** The fields of an audit event worth a column, in the order shown. */
const FIELDS = ["method", "host", "path", "outcome", "rule", "secrets", "secret", "reason"] as const;

function summary(data: Record<string, unknown>): string {
  return FIELDS.filter((f) => data[f] !== undefined && data[f] !== null)
    .map((f) => {
      const v = data[f];
      return `${f} ${typeof v === "string" ? v : JSON.stringify(v)}`;
    })
    .join(" · ");
}

export function AuditLog({ sandboxId }: { sandboxId: string }) {
  const [events, setEvents] = useState<BothyEvent[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    const load = (): void => {
      getJson<{ events: BothyEvent[] }>(`/sandboxes/${sandboxId}/audit?limit=200`)
        .then((r) => setEvents(r.events))
        .catch((err: unknown) => setError(err instanceof ApiError ? err.message : String(err)));
    };
    load();
    return onEvents(AUDIT_EVENT_TYPES, (_type, data) => {
      if ((data as { sandbox_id?: string }).sandbox_id === sandboxId) load();
    });
  }, [sandboxId]);
  return (
    <section aria-labelledby="audit-title">
      <h2 id="audit-title">Audit</h2>
      {error !== null && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
      {events !== null && events.length === 0 && <p class="empty">No egress decisions yet.</p>}
      <ol class="audit">
        {(events ?? []).map((e) => (
          <li key={e.seq} data-type={e.type}>
            <time dateTime={e.created_at}>{e.created_at.slice(11, 19)}</time> <strong>{e.type}</strong>{" "}
            {summary(e.data)}
          </li>
        ))}
      </ol>
    </section>
  );
}
