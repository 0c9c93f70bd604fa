/** What the signed-in key may do, from the scopes GET /ui/session returns: buttons that would fail are not shown. */
import type { UiSessionInfo } from "@bothy/protocol";

export type Can = (scope: UiSessionInfo["scopes"][number]) => boolean;

export function canOf(session: UiSessionInfo): Can {
  const scopes = new Set(session.scopes);
  return (scope) => scopes.has("admin") || scopes.has(scope);
}
