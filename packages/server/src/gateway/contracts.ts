/**
 * How the egress gateway's parts meet: the proxy (egress-proxy.ts) asks the vault for a sandbox's
 * secret bindings and clear values, the CA for a leaf certificate of a host it terminates, and the
 * approval gate whether a request held by an `ask` rule may go out. Each part is built and tested
 * on its own against these.
 */
import type { ApprovalCancelReason, EffectiveHostPolicy } from "@bothy/protocol";

/** A vault secret as bound to one sandbox: the sandbox sees `env=placeholder`, never the value. */
export interface SecretBinding {
  name: string;
  /** The sandbox's variable holding the placeholder (`GITHUB`). */
  env: string;
  /** `bothy_ph_` + random; unique per sandbox and secret. */
  placeholder: string;
  hosts: string[];
  inject: { header: string; format: string } | null;
}

export interface SecretSource {
  /** The sandbox's bindings (from the ledger; they survive a restart). */
  bindings(sandboxId: string): SecretBinding[];
  /** The clear value, decrypted on each use and never kept, logged or sent anywhere but the bound hosts. */
  reveal(tenant: string, name: string): Buffer;
}

export interface LeafIssuer {
  /** The CA the guests trust (PEM). */
  readonly caPem: string;
  /** A certificate for `host` signed by that CA (cached). */
  leafFor(host: string): Promise<{ key: string; cert: string }>;
}

export interface ApprovalAsk {
  tenant: string;
  sandboxId: string;
  conversationId: string | null;
  kind: "http" | "tool";
  method: string | null;
  host: string | null;
  path: string | null;
  tool: string | null;
  /** At most 8 KiB, secret values already masked. */
  excerpt: string;
  /** The rule that asked (`tenant#0`, `sandbox#2`, `default`). */
  rule: string;
}

export interface ApprovalOutcome {
  approvalId: string;
  state: "approved" | "denied" | "expired" | "cancelled";
  /** Why it was cancelled: `server_stopping` is worth a retry (the proxy answers 503 retryable). */
  cancelReason?: ApprovalCancelReason;
  /** The decider's reason, if they gave one (to show in a denial). */
  reason?: string;
}

export interface ApprovalGate {
  /** True while an earlier `host` grant for this sandbox and host lasts. */
  granted(sandboxId: string, host: string): boolean;
  /** Holds until a person decides, it expires, or `signal` aborts (the client went away: cancelled). */
  ask(req: ApprovalAsk, signal: AbortSignal): Promise<ApprovalOutcome>;
}

/** The effective policy of a live sandbox under the gateway, by its guest address. */
export interface GatewaySandbox {
  sandboxId: string;
  tenant: string;
  /** Its `allow_out` CIDRs: a private address they name may be dialed, as the nft rules allow. */
  allowOut: string[];
  denyOut: string[];
  policy: EffectiveHostPolicy;
}
