/**
 * The approvals inbox: what an `ask` rule holds, live; approve once or for N minutes (the sandbox's
 * requests to that host pass until then), or deny with a reason. The timed grants in force are
 * listed with their time left. The browser's notification for a new request is offered by a
 * button (permission is asked on that click, never on load).
 */
import type { ApprovalInfo } from "@bothy/protocol";
import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { ApiError, getJson, sendJson } from "../api.ts";
import type { PageProps } from "../app.tsx";
import { onEvents } from "../events.ts";
import { notifyApproval, NotifyToggle } from "../notifications.tsx";
import { span } from "../time.ts";

/** The lengths a timed grant is offered for, in minutes (the API takes 1 to 1440). */
const GRANT_MINUTES = [5, 15, 60, 240] as const;

const whatOf = (a: ApprovalInfo): string =>
  a.kind === "tool" ? `tool ${a.tool ?? "?"}` : `${a.method ?? "?"} ${a.host ?? "?"}${a.path ?? ""}`;

export function ApprovalsPage({ can }: PageProps) {
  const [pending, setPending] = useState<ApprovalInfo[] | null>(null);
  const [grants, setGrants] = useState<ApprovalInfo[]>([]);
  const [error, setError] = useState<string | null>(null);
  const [now, setNow] = useState(Date.now());
  /** Pending ids already seen, so a notification is shown once per new request (none for those there on load). */
  const seen = useRef<Set<string> | null>(null);
  const allowed = can("approvals:decide");
  const load = useCallback(() => {
    if (!allowed) return;
    Promise.all([
      getJson<{ approvals: ApprovalInfo[] }>("/approvals?state=pending"),
      getJson<{ approvals: ApprovalInfo[] }>("/approvals?state=approved&limit=100"),
    ])
      .then(([held, approved]) => {
        const known = seen.current;
        for (const a of held.approvals) if (known && !known.has(a.approval_id)) notifyApproval(whatOf(a), a.sandbox_id);
        seen.current = new Set(held.approvals.map((a) => a.approval_id));
        setPending(held.approvals);
        setGrants(
          approved.approvals.filter(
            (a) => a.grant?.kind === "host" && a.grant.until !== null && Date.parse(a.grant.until) > Date.now(),
          ),
        );
        setError(null);
      })
      .catch((err: unknown) => setError(err instanceof ApiError ? err.message : String(err)));
  }, [allowed]);
  useEffect(() => {
    load();
    const timer = setInterval(() => setNow(Date.now()), 1000);
    const off = onEvents(["approval.requested", "approval.decided"], load);
    return () => {
      clearInterval(timer);
      off();
    };
  }, [load]);
  if (!allowed)
    return (
      <>
        <h1>Approvals</h1>
        <p>This key lacks the approvals:decide scope; sign in with a key that has it to decide held requests.</p>
      </>
    );
  const live = grants.filter((g) => Date.parse(g.grant?.until ?? "") > now);
  return (
    <>
      <h1>Approvals</h1>
      <NotifyToggle />
      {error !== null && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
      {pending !== null && pending.length === 0 && <p class="empty">Nothing is waiting for a decision.</p>}
      <ul class="approvals">
        {(pending ?? []).map((a) => (
          <ApprovalCard key={a.approval_id} approval={a} now={now} onDecided={load} />
        ))}
      </ul>
      {live.length > 0 && (
        <section aria-labelledby="grants-title">
          <h2 id="grants-title">Timed grants</h2>
          <ul class="grants">
            {live.map((g) => (
              <li key={g.approval_id} data-grant={g.approval_id}>
                {g.sandbox_id} → {g.host} · {span(Date.parse(g.grant?.until ?? "") - now)} left
              </li>
            ))}
          </ul>
        </section>
      )}
    </>
  );
}

function ApprovalCard({ approval: a, now, onDecided }: { approval: ApprovalInfo; now: number; onDecided: () => void }) {
  const [reason, setReason] = useState("");
  const [minutes, setMinutes] = useState<number>(GRANT_MINUTES[1]);
  const [error, setError] = useState<string | null>(null);
  const decide = async (verb: "approve" | "deny", body: Record<string, unknown>): Promise<void> => {
    try {
      await sendJson("POST", `/approvals/${a.approval_id}/${verb}`, body);
      onDecided();
    } catch (err) {
      setError(err instanceof ApiError ? err.message : String(err));
    }
  };
  const reasonId = `reason-${a.approval_id}`;
  const minutesId = `minutes-${a.approval_id}`;
  return (
    <li class="approval" data-approval={a.approval_id}>
      <h2>{whatOf(a)}</h2>
      <p class="meta">
        {a.sandbox_id} · rule {a.rule} · <span class="time-left">{span(Date.parse(a.expires_at) - now)} left</span>
      </p>
      {a.excerpt !== "" && <pre class="excerpt">{a.excerpt}</pre>}
      <div class="actions">
        <button type="button" onClick={() => void decide("approve", { grant: "once" })}>
          Approve once
        </button>
        {a.kind === "http" && a.host !== null && (
          <>
            <label for={minutesId}>Minutes</label>
            <select
              id={minutesId}
              value={minutes}
              onChange={(ev) => setMinutes(Number((ev.target as HTMLSelectElement).value))}
            >
              {GRANT_MINUTES.map((m) => (
                <option key={m} value={m}>
                  {m}
                </option>
              ))}
            </select>
            <button type="button" onClick={() => void decide("approve", { grant: "host", minutes })}>
              Approve {a.host} for {minutes} min
            </button>
          </>
        )}
        <label for={reasonId}>Reason</label>
        <input id={reasonId} value={reason} onInput={(ev) => setReason((ev.target as HTMLInputElement).value)} />
        <button type="button" class="danger" onClick={() => void decide("deny", reason ? { reason } : {})}>
          Deny
        </button>
      </div>
      {error !== null && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
    </li>
  );
}
