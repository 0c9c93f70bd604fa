/**
 * The live feed: one EventSource on /events (the cookie authenticates it) shared by every page;
 * a page names the event types it cares about and gets a call for each.
 */
type Listener = (type: string, data: unknown) => void;

let source: EventSource | undefined;
const listeners = new Map<string, Set<Listener>>();

function ensure(): EventSource {
  source ??= new EventSource("/events", { withCredentials: true });
  return source;
}

/** Subscribes `listener` to these event types; returns the unsubscribe. */
export function onEvents(types: readonly string[], listener: Listener): () => void {
  const es = ensure();
  const handlers = types.map((type) => {
    let set = listeners.get(type);
    if (!set) {
      listeners.set(type, (set = new Set()));
      const all = set;
      es.addEventListener(type, (ev) => {
        const data: unknown = JSON.parse((ev as MessageEvent<string>).data);
        for (const l of all) l(type, data);
      });
    }
    set.add(listener);
    return set;
  });
  return () => {
    for (const set of handlers) set.delete(listener);
  };
}

/** Ends the feed (sign-out). */
export function closeEvents(): void {
  source?.close();
  source = undefined;
  listeners.clear();
}
