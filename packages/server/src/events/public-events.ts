import type { BothyEvent } from "@bothy/protocol";
import type { ServerEvent } from "./server-events.ts";

export interface PublicEvent {
  type: BothyEvent["type"];
  sandboxId: string;
  data: Record<string, unknown>;
  /** Its tenant, when not its sandbox's (looked up otherwise). */
  tenant?: string;
}

/** The public event (SSE, webhook) a server event becomes, if clients care about it. */
export function toPublicEvent(ev: ServerEvent): PublicEvent | undefined {
  const { event, ...data } = ev;
  switch (ev.event) {
    case "sandbox_created":
      return { type: "sandbox.created", sandboxId: ev.sandbox_id, data };
    case "sandbox_deleted":
      return { type: "sandbox.deleted", sandboxId: ev.sandbox_id, data };
    case "sandbox_lost":
      return { type: "sandbox.failed", sandboxId: ev.sandbox_id, data: { ...data, reason: event } };
    case "sandbox_died":
    case "sandbox_slept":
    case "sandbox_timed_out":
      return { type: "sandbox.stopped", sandboxId: ev.sandbox_id, data: { ...data, reason: event } };
    case "sandbox_woken":
      return { type: "sandbox.woken", sandboxId: ev.sandbox_id, data };
    case "egress_allowed":
      return { type: "egress.allowed", sandboxId: ev.sandbox_id, data };
    case "egress_denied":
      return { type: "egress.denied", sandboxId: ev.sandbox_id, data };
    case "egress_asked":
      return { type: "egress.asked", sandboxId: ev.sandbox_id, data };
    case "secret_injected":
      return { type: "secret.injected", sandboxId: ev.sandbox_id, data };
    case "secret_refused":
      return { type: "secret.refused", sandboxId: ev.sandbox_id, data };
    case "approval_requested":
      return { type: "approval.requested", sandboxId: ev.sandbox_id, data, tenant: ev.tenant };
    case "approval_decided":
      return { type: "approval.decided", sandboxId: ev.sandbox_id, data, tenant: ev.tenant };
    default:
      return undefined;
  }
}
