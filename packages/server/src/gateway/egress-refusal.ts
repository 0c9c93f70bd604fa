/**
 * What the egress gateway judges and how it says no: the target a request is judged as, a
 * refusal (the problem a plain-HTTP client gets; HTTPS gets a TLS alert), and the conversion of
 * any failure on a request's way into that problem.
 */
import { BothyError, toProblem } from "@bothy/protocol";

/** What a request is judged as. */
export interface Target {
  host: string;
  method: string | null;
  path: string | null;
  /** When the request reached the gateway (`performance.now()`), for the decision's latency. */
  since?: number;
}

/** A refusal: the problem a plain-HTTP client gets (HTTPS gets the alert), and the event it was. */
export class Refusal extends Error {
  constructor(readonly error: BothyError) {
    super(error.message);
  }
}

export const malformed = (message: string): BothyError => new BothyError("malformed_request", message);

export function problemOf(err: unknown): ReturnType<typeof toProblem> {
  if (err instanceof Refusal) return toProblem(err.error);
  if (err instanceof BothyError) return toProblem(err);
  return toProblem(new BothyError("egress_unreachable", `The gateway could not send this request (${errCode(err)}).`));
}

export const errCode = (err: unknown): string =>
  (err as { code?: string }).code ?? (err instanceof Error ? err.message : "unknown error");
