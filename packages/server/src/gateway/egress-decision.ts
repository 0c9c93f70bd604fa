/**
 * The egress gateway's decision on one request, apart from any socket: the sandbox's host rules
 * (host-policy.ts) first, so a denied host is never resolved; then the resolved address's checks
 * (egress-resolver.ts); then, for an `ask` rule, a person's answer through the approval gate, the
 * request held meanwhile. A secret's placeholder in clear HTTP and a body the gateway cannot frame
 * are refused here too. Every decision is a server event (the audit). The transport
 * (egress-proxy.ts) and the TLS terminator (through `verdict`) ask it.
 */
import { isIPv4 } from "node:net";
import { BothyError, PLACEHOLDER_PREFIX } from "@bothy/protocol";
import type { EgressDecisionFields, Logger } from "../events/server-events.ts";
import type { ApprovalGate, EgressVerdict, GatewaySandbox } from "./contracts.ts";
import { decide, type Decision } from "./host-policy.ts";
import { addressRefusal, EgressResolver } from "./egress-resolver.ts";
import type { SandboxLookup } from "./gateway-lookup.ts";
import { errCode, problemOf, Refusal, type Target } from "./egress-refusal.ts";

const EXCERPT_BYTES = 8 * 1024;

export interface EgressDecisionsOptions {
  /** The resolvers names are looked up with (BOTHY_DNS): the same the sandboxes are given. */
  dns: string[];
  log: Logger;
  /** Where `ask` rules wait for a person; absent: they are answered as denied (approvals not available). */
  gate?: ApprovalGate;
}

export class EgressDecisions {
  private readonly resolver: EgressResolver;
  /** Requests held for an approval: aborted when the server stops; each settles once its gate answered. */
  private readonly held = new Map<AbortController, Promise<void>>();
  private lookup: SandboxLookup | undefined;
  private gate: ApprovalGate | undefined;
  private closing = false;

  constructor(private readonly opts: EgressDecisionsOptions) {
    this.resolver = new EgressResolver(opts.dns);
    this.gate = opts.gate;
  }

  /** The sandboxes to judge for, and the approval gate once it exists. */
  attach(lookup: SandboxLookup, gate?: ApprovalGate): void {
    this.lookup = lookup;
    if (gate) this.gate = gate;
  }

  /**
   * The server stops: held requests are cancelled (answered `503` retryable, nothing goes out
   * later); the promise settles once each has its answer.
   */
  stop(): Promise<void> {
    this.closing = true;
    const held = [...this.held];
    for (const [c] of held) c.abort();
    return Promise.all(held.map(([, settled]) => settled)).then(() => undefined);
  }

  /** Ends the name lookups under way. */
  cancelLookups(): void {
    this.resolver.cancel();
  }

  /** A secret's placeholder in clear HTTP: refused and reported (what carried it, never its value). */
  placeholderRefusal(sb: GatewaySandbox, target: Target, where: string): Refusal {
    this.emit("egress_denied", sb, target, { rule: "placeholder", action: "deny", outcome: "refused" }, where);
    return new Refusal(
      new BothyError(
        "egress_denied",
        `A secret's placeholder (${PLACEHOLDER_PREFIX}…) was sent in clear HTTP to ${target.host} (${where}); secrets only go out over HTTPS to the hosts they are bound to.`,
        { details: { host: target.host, rule: "placeholder" } },
      ),
    );
  }

  /**
   * A request whose body the gateway cannot frame for the upstream (request-framing.ts): reported
   * and refused before it is judged.
   */
  framingRefusal(sb: GatewaySandbox, target: Target, error: BothyError): Refusal {
    this.emit("egress_denied", sb, target, { rule: "framing", action: "deny", outcome: "refused" }, error.message);
    return new Refusal(error);
  }

  /**
   * The terminator's per-request question: the rules and approvals, answered as a verdict. A
   * request held for a person shows its body's first bytes, as on plain HTTP.
   */
  async verdict(
    sb: GatewaySandbox,
    target: Target,
    signal: AbortSignal,
    excerpt?: () => Promise<Buffer>,
  ): Promise<EgressVerdict> {
    try {
      const decision = decide(sb.policy, target);
      if (sb.internet === false && decision.rule === "default" && decision.action === "allow") {
        this.emit(
          "egress_denied",
          sb,
          target,
          { rule: "default", action: "allow", outcome: "refused" },
          "internet is off",
        );
        throw new Refusal(denial(sb, target, "default"));
      }
      const held = decision.action === "ask" && !(await this.granted(sb, target.host));
      const body = held && excerpt ? await excerpt() : Buffer.alloc(0);
      await this.approve(sb, target, decision, signal, body, undefined);
      return "allow";
    } catch (err) {
      const problem = problemOf(err);
      return { status: problem.status, body: problem };
    }
  }

  async granted(sb: GatewaySandbox, host: string): Promise<boolean> {
    return (await this.gate?.granted(sb.sandboxId, host)) ?? false;
  }

  /**
   * The address a request may go to, or a Refusal: the rules first (a denied host is never
   * resolved), then the resolved address's checks, then, for `ask`, a person's answer.
   */
  async judge(
    sb: GatewaySandbox,
    target: Target,
    decision: Decision,
    signal: AbortSignal,
    body: Buffer | undefined,
  ): Promise<string> {
    if (decision.action === "deny") throw this.denied(sb, target, decision, {});
    const address = await this.checkedAddress(sb, target, decision.rule !== "default" || decision.action === "ask");
    await this.approve(sb, target, decision, signal, body, address);
    return address;
  }

  /** A denial as an event and the refusal to answer with; a path without one reading is refused as such. */
  private denied(
    sb: GatewaySandbox,
    target: Target,
    decision: Decision,
    base: Pick<EgressDecisionFields, "address">,
  ): Refusal {
    const fields = { ...base, rule: decision.rule, action: "deny" as const };
    if (decision.ambiguousPath === undefined) {
      this.emit("egress_denied", sb, target, { ...fields, outcome: "denied" });
      return new Refusal(denial(sb, target, decision.rule));
    }
    this.emit(
      "egress_denied",
      sb,
      target,
      { ...fields, outcome: "refused" },
      `ambiguous path: ${decision.ambiguousPath}`,
    );
    return new Refusal(ambiguousPath(target, decision.rule, decision.ambiguousPath));
  }

  /** Allows an allow; holds an ask until a person answers; emits the decision. */
  private async approve(
    sb: GatewaySandbox,
    target: Target,
    decision: Decision,
    signal: AbortSignal,
    body: Buffer | undefined,
    address: string | undefined,
  ): Promise<void> {
    const base = { rule: decision.rule, action: decision.action, ...(address ? { address } : {}) } as const;
    if (decision.action === "deny") throw this.denied(sb, target, decision, base);
    if (decision.action === "allow") return this.emit("egress_allowed", sb, target, { ...base, outcome: "allowed" });
    if (await this.granted(sb, target.host))
      return this.emit("egress_allowed", sb, target, { ...base, outcome: "granted" });
    const gate = this.gate;
    if (!gate) {
      this.emit("egress_denied", sb, target, { ...base, outcome: "unavailable" }, "approvals are not available");
      throw new Refusal(
        new BothyError(
          "egress_denied",
          `Rule ${decision.rule} asks a person before ${describe(target)} goes out, and approvals are not available on this server; the request was not sent.`,
          { details: { host: target.host, rule: decision.rule, how_to_get_access: howToAsk(sb) } },
        ),
      );
    }
    const held = new AbortController();
    const onAbort = (): void => held.abort();
    signal.addEventListener("abort", onAbort);
    let settle = (): void => undefined;
    this.held.set(held, new Promise<void>((resolve) => (settle = resolve)));
    this.emit("egress_asked", sb, target, { ...base, outcome: "pending" });
    try {
      const outcome = await gate.ask(
        {
          tenant: sb.tenant,
          sandboxId: sb.sandboxId,
          conversationId: null,
          kind: "http",
          method: target.method,
          host: target.host,
          path: target.path,
          tool: null,
          excerpt: (body ?? Buffer.alloc(0)).subarray(0, EXCERPT_BYTES).toString("utf8"),
          rule: decision.rule,
        },
        held.signal,
      );
      if (outcome.state === "approved")
        return this.emit(
          "egress_allowed",
          sb,
          target,
          { ...base, outcome: "approved" },
          `approval ${outcome.approvalId}`,
        );
      const which = `approval ${outcome.approvalId}${outcome.cancelReason ? `: ${outcome.cancelReason}` : ""}`;
      this.emit("egress_denied", sb, target, { ...base, outcome: outcome.state }, which);
      // Cancelled while the client still waits: the server is stopping (the gate's own stop or ours).
      if (outcome.state === "cancelled" || this.closing) throw new Refusal(stopping(outcome.approvalId));
      throw new Refusal(
        new BothyError(
          "egress_denied",
          `${describe(target)} waited for approval ${outcome.approvalId}, which was ${outcome.state}${outcome.reason ? ` (${outcome.reason})` : ""}; the request was not sent.`,
          {
            details: { host: target.host, rule: decision.rule, approval_id: outcome.approvalId, state: outcome.state },
          },
        ),
      );
    } catch (err) {
      if (err instanceof Refusal) throw err;
      this.emit("egress_denied", sb, target, { ...base, outcome: "cancelled" });
      throw new Refusal(stopping(null));
    } finally {
      signal.removeEventListener("abort", onAbort);
      this.held.delete(held);
      settle();
    }
  }

  /**
   * Resolves the host (an IPv4 literal is itself) with the server's resolvers and returns the
   * first address the sandbox may reach; refused with the reason when none is. `explicit`: an
   * allow rule or an approval named this host (what `internet: false` lets out).
   */
  async checkedAddress(sb: GatewaySandbox, target: Target, explicit: boolean): Promise<string> {
    let addresses: string[];
    if (isIPv4(target.host)) addresses = [target.host];
    else if (sb.internet === false && !explicit) {
      // Not even looked up: the name would reach BOTHY_DNS's upstreams, a channel out of a closed sandbox.
      const reason = "internet is off and no allow rule names this host";
      this.emit("egress_denied", sb, target, { rule: "address", action: "deny", outcome: "refused" }, reason);
      throw new Refusal(
        new BothyError("egress_denied", `${target.host} was not looked up: ${reason}.`, {
          details: { host: target.host, rule: "address", how_to_get_access: howToAsk(sb) },
        }),
      );
    } else {
      try {
        addresses = await this.resolver.resolve(target.host);
      } catch (err) {
        this.emit(
          "egress_denied",
          sb,
          target,
          { rule: "address", action: "deny", outcome: "unresolved" },
          `${target.host} does not resolve (${errCode(err)})`,
        );
        throw new Refusal(
          new BothyError("egress_unreachable", `${target.host} does not resolve (${errCode(err)}).`, {
            details: { host: target.host },
          }),
        );
      }
    }
    const reasons: string[] = [];
    for (const address of addresses) {
      const why = addressRefusal(this.lookup, sb, address, explicit);
      if (why === undefined) return address;
      reasons.push(`${address}: ${why}`);
    }
    const reason = reasons.join("; ");
    this.emit("egress_denied", sb, target, { rule: "address", action: "deny", outcome: "refused" }, reason);
    throw new Refusal(
      new BothyError(
        "egress_denied",
        `${target.host} resolves only to addresses this sandbox may not reach (${reason}).`,
        {
          details: { host: target.host, rule: "address", how_to_get_access: howToAsk(sb) },
        },
      ),
    );
  }

  emit(
    event: "egress_allowed" | "egress_denied" | "egress_asked",
    sb: GatewaySandbox,
    target: Target,
    d: Pick<EgressDecisionFields, "rule" | "action" | "outcome" | "address">,
    reason?: string,
  ): void {
    const fields = {
      sandbox_id: sb.sandboxId,
      host: target.host,
      method: target.method,
      path: target.path === null ? null : target.path.split("?", 1)[0]!,
      ...d,
      ...(reason === undefined ? {} : { reason }),
      ...(target.since === undefined ? {} : { ms: performance.now() - target.since }),
    };
    // After this turn's I/O is under way: the audit's ledger write is not on the request's path.
    setImmediate(() => this.opts.log(event, fields));
  }
}

const describe = (t: Target): string =>
  t.method === null ? `HTTPS to ${t.host}` : `${t.method} ${t.host}${t.path ?? ""}`;

/** How a sandbox's user gets a host allowed: which policy holds the rule that decided. */
function howToAsk(sb: GatewaySandbox): string {
  return `A sandbox's own host rules are given at create (the \`policy\` field: allow_hosts, rules); its tenant's default with PUT /policy (scope \`policy\`), whose rules come first. See GET /sandboxes/${sb.sandboxId} for the effective policy.`;
}

function denial(sb: GatewaySandbox, target: Target, rule: string): BothyError {
  const which =
    rule === "default"
      ? "the policy's default (no rule names this host)"
      : `rule ${rule} (the ${rule.startsWith("tenant") ? "tenant's" : "sandbox's"} host rules, index ${rule.split("#")[1]})`;
  return new BothyError("egress_denied", `${describe(target)} was denied by ${which}.`, {
    details: { host: target.host, rule, how_to_get_access: howToAsk(sb) },
  });
}

/** A path the rules cannot judge: refused rather than read one way when the upstream may read it another. */
function ambiguousPath(target: Target, rule: string, problem: string): BothyError {
  return new BothyError(
    "egress_denied",
    `${target.method ?? "A request"} to ${target.host} was refused: servers read its path in different ways (${problem}), and rule ${rule} judges paths. Send it as a browser or curl would: with . and .. resolved, no //, and without %2F, %5C, %2E, %25, escaped control characters, backslashes or ";" after a dot segment.`,
    { details: { host: target.host, rule, reason: "ambiguous_path", problem } },
  );
}

/** A held request's answer when the server stops: nothing was sent, so retrying is safe. */
const stopping = (approvalId: string | null): BothyError =>
  new BothyError(
    "shutting_down",
    "The server stopped while this request waited for approval; it was not sent: retry.",
    {
      details: { retryable: true, ...(approvalId ? { approval_id: approvalId } : {}) },
    },
  );
