/**
 * The list's usage column: what each sandbox has metered (GET /usage/sandboxes, one call for the
 * whole list, not one per row), fetched beside the list when the page opens and again every
 * USAGE_REFRESH_MS while it is open, since usage grows without an event saying so. A list that
 * changes does not fetch it again: a sandbox just made has metered nothing yet.
 */
import type { SandboxUsageList } from "@bothy/protocol";
import { useEffect, useState } from "preact/hooks";
import { getJson } from "../api.ts";

const USAGE_REFRESH_MS = 30_000;

export type UsageBySandbox = ReadonlyMap<string, SandboxUsageList["sandboxes"][number]>;

/** Usage by sandbox id. */
export function useUsage(): UsageBySandbox {
  const [usage, setUsage] = useState<UsageBySandbox>(new Map());
  useEffect(() => {
    let gone = false;
    const load = (): void => {
      getJson<SandboxUsageList>("/usage/sandboxes")
        .then((r) => {
          if (!gone) setUsage(new Map(r.sandboxes.map((u) => [u.sandbox_id, u])));
        })
        // The column is a nicety: the list shows without it, and the next refresh tries again.
        .catch((err: unknown) => console.warn(err));
    };
    load();
    const timer = setInterval(load, USAGE_REFRESH_MS);
    return () => {
      gone = true;
      clearInterval(timer);
    };
  }, []);
  return usage;
}

/** "12 vCPU·s · 3.0 GiB·s", or "none yet" for a sandbox that has metered nothing. */
export function usageText(u: SandboxUsageList["sandboxes"][number] | undefined): string {
  if (u === undefined) return "none yet";
  return `${u.vcpu_seconds.toFixed(0)} vCPU·s · ${u.gib_seconds.toFixed(1)} GiB·s`;
}
