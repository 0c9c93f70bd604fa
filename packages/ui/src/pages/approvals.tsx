/** The approvals inbox: what an `ask` rule holds, live; approve once or deny with a reason. */
import type { ApprovalInfo } from "@bothy/protocol";
import { useCallback, useEffect, useState } from "preact/hooks";
import { ApiError, getJson, sendJson } from "../api.ts";
import type { PageProps } from "../app.tsx";
import { onEvents } from "../events.ts";
import { span } from "../time.ts";

export function ApprovalsPage({ can }: PageProps) {
  const [pending, setPending] = useState<ApprovalInfo[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [now, setNow] = useState(Date.now());
  const allowed = can("approvals:decide");
  const load = useCallback(() => {
    if (!allowed) return;
    getJson<{ approvals: ApprovalInfo[] }>("/approvals?state=pending")
      .then((r) => {
        setPending(r.approvals);
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
  return (
    <>
      <h1>Approvals</h1>
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
    </>
  );
}

function ApprovalCard({ approval: a, now, onDecided }: { approval: ApprovalInfo; now: number; onDecided: () => void }) {
  const [reason, setReason] = useState("");
  const [error, setError] = useState<string | null>(null);
  const decide = async (verb: "approve" | "deny"): Promise<void> => {
    try {
      await sendJson(
        "POST",
        `/approvals/${a.approval_id}/${verb}`,
        verb === "approve" ? { grant: "once" } : reason ? { reason } : {},
      );
      onDecided();
    } catch (err) {
      setError(err instanceof ApiError ? err.message : String(err));
    }
  };
  const what = a.kind === "tool" ? `tool ${a.tool ?? "?"}` : `${a.method ?? "?"} ${a.host ?? "?"}${a.path ?? ""}`;
  const reasonId = `reason-${a.approval_id}`;
  return (
    <li class="approval" data-approval={a.approval_id}>
      <h2>{what}</h2>
      <p class="meta">
        {a.sandbox_id} · rule {a.rule} · <span class="time-left">{span(Date.parse(a.expires_at) - now)} left</span>
      </p>
      {a.excerpt !== "" && <pre class="excerpt">{a.excerpt}</pre>}
      <div class="actions">
        <button type="button" onClick={() => void decide("approve")}>
          Approve once
        </button>
        <label for={reasonId}>Reason</label>
        <input id={reasonId} value={reason} onInput={(ev) => setReason((ev.target as HTMLInputElement).value)} />
        <button type="button" class="danger" onClick={() => void decide("deny")}>
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
