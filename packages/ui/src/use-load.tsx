/**
 * One page's data from the API: fetched on mount and by `reload`, with the server's words when a
 * call fails (`fail`, for the page's own writes too). Every admin page reads this way.
 */
import { useCallback, useEffect, useState } from "preact/hooks";
import { ApiError } from "./api.ts";

export interface Loaded<T> {
  data: T | null;
  error: string | null;
  reload: () => void;
  fail: (err: unknown) => void;
  clearError: () => void;
}

export function messageOf(err: unknown): string {
  return err instanceof ApiError ? err.message : String(err);
}

/** `load` is called again whenever `deps` change (a tenant picked, say). */
export function useLoad<T>(load: () => Promise<T>, deps: readonly unknown[] = []): Loaded<T> {
  const [data, setData] = useState<T | null>(null);
  const [error, setError] = useState<string | null>(null);
  const fail = useCallback((err: unknown) => setError(messageOf(err)), []);
  // The error goes when a reload starts, not when it lands: a write that failed meanwhile keeps its words.
  const reload = useCallback(() => {
    setError(null);
    load().then(setData).catch(fail);
  }, deps);
  useEffect(reload, [reload]);
  return { data, error, reload, fail, clearError: () => setError(null) };
}

/** The page's error line, read out when it appears. */
export function ErrorLine({ error }: { error: string | null }) {
  return error === null ? null : (
    <p role="alert" class="error">
      {error}
    </p>
  );
}
