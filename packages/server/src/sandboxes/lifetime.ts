import { BothyError, setTimeoutRequest, type OnTimeout } from "@bothy/protocol";
import type { Config } from "../config.ts";

/** The lifetime fields of a create request, checked against this host's limits, with defaults applied. */
export interface Lifetime {
  timeoutS: number;
  deleteOnDisconnect: boolean;
  disconnectGraceS: number;
  onTimeout: OnTimeout;
  autoWake: boolean;
}

/** The most a sandbox may wait for its client to come back, in seconds. */
export const MAX_DISCONNECT_GRACE_S = 3600;

export function checkTimeout(timeoutS: number, maxTimeoutS: number): number {
  if (timeoutS < 1 || timeoutS > maxTimeoutS) {
    throw new BothyError(
      "invalid_request",
      `timeout_s must be between 1 and ${maxTimeoutS} seconds on this host (BOTHY_MAX_TIMEOUT_S); got ${timeoutS}.`,
    );
  }
  return timeoutS;
}

export function lifetimeOf(
  req: {
    timeout_s?: number | undefined;
    delete_on_disconnect?: boolean | undefined;
    disconnect_grace_s?: number | undefined;
    on_timeout?: OnTimeout | undefined;
    auto_wake?: boolean | undefined;
  },
  limits: Config["lifecycle"],
): Lifetime {
  const grace = req.disconnect_grace_s ?? limits.disconnectGraceS;
  if (grace < 0 || grace > MAX_DISCONNECT_GRACE_S) {
    throw new BothyError(
      "invalid_request",
      `disconnect_grace_s must be between 0 and ${MAX_DISCONNECT_GRACE_S} seconds; got ${grace}.`,
    );
  }
  return {
    timeoutS: checkTimeout(req.timeout_s ?? limits.defaultTimeoutS, limits.maxTimeoutS),
    deleteOnDisconnect: req.delete_on_disconnect ?? false,
    disconnectGraceS: grace,
    onTimeout: req.on_timeout ?? "delete",
    autoWake: req.auto_wake ?? true,
  };
}

/** The `timeout_s` of a `POST /sandboxes/{id}/timeout` body. */
export function parseSetTimeout(body: unknown, maxTimeoutS: number): number {
  const parsed = setTimeoutRequest.safeParse(body ?? {});
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const where = issue?.path.length ? `${issue.path.join(".")}: ` : "";
    throw new BothyError(
      "invalid_request",
      `${where}${issue?.message ?? "invalid body"}. Expected {"timeout_s":300} (whole seconds from now).`,
    );
  }
  return checkTimeout(parsed.data.timeout_s, maxTimeoutS);
}

/** The ISO time `seconds` from now. */
export function expiryFrom(seconds: number, now = Date.now()): string {
  return new Date(now + seconds * 1000).toISOString();
}
