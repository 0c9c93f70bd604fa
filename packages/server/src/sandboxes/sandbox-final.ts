import type { ServerEvents } from "../events/server-events.ts";

/**
 * Calls `forget` with a sandbox's id once it is over (`deleted` or `failed`), on the one
 * `sandbox_final` event the actor emits (sandbox-actor.ts). Every part that keeps state per
 * sandbox beside its row (the command registry and its replay buffers, the E2B rows) drops it
 * here, so a sandbox that fails leaks nothing until a restart, as one that is deleted.
 */
export function onSandboxFinal(events: ServerEvents, forget: (sandboxId: string) => void): () => void {
  return events.subscribe((ev) => {
    if (ev.event === "sandbox_final") forget(ev.sandbox_id);
  });
}
