/**
 * How the egress gateway's parts meet: the proxy (egress-proxy.ts) asks the vault for a sandbox's
 * secret bindings and clear values, the CA for a leaf certificate of a host it terminates, and the
 * approval gate whether a request held by an `ask` rule may go out. Each part is built and tested
 * on its own against these.
 */
import type { Duplex } from "node:stream";
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
  bindings(sandboxId: string): Promise<SecretBinding[]>;
  /** The clear value, decrypted on each use and never kept, logged or sent anywhere but the bound hosts. */
  reveal(tenant: string, name: string): Promise<Buffer>;
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
  granted(sandboxId: string, host: string): Promise<boolean>;
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
  /** false (`internet: false`): only hosts an allow rule names (or a person approved) and `allow_out` addresses go out. Default true. */
  internet?: boolean;
  policy: EffectiveHostPolicy;
}

/** The gateway's word on one request seen inside terminated TLS: go on, or answer this instead. */
export type EgressVerdict = "allow" | { status: number; body: string | object };

/**
 * What the proxy hands the TLS terminator (the vault's tls-terminator.ts) for a connection it must
 * open: one to a host a secret of the sandbox may be bound to, or whose rules need the method and
 * path. The terminator answers the sandbox with a leaf for `host`, judges each request by `decide`
 * and sends it on to the address `dial` checked.
 */
export interface TerminateContext {
  /** The sandbox's connection, paused; `peeked` (its ClientHello) was read from it and must be put back. */
  socket: Duplex;
  peeked: Buffer;
  /** The SNI name. */
  host: string;
  sandbox: GatewaySandbox;
  /** Resolves `host` and returns the one address it checked (never private, pool or blocked); dial exactly that. */
  dial(): Promise<string>;
  /**
   * The policy's word on one request (rules, approvals and the audit event included); held while an
   * approval is pending; `signal` aborts when the client goes. `excerpt` reads the first bytes of
   * the request's body, for an approval to show; it is called only when a person must decide.
   */
  decide(method: string, path: string, signal: AbortSignal, excerpt?: () => Promise<Buffer>): Promise<EgressVerdict>;
}

/** The terminator the proxy calls; absent: a connection that needs one is refused. */
export type Terminate = (ctx: TerminateContext) => void;
