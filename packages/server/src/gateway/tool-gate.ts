/**
 * The agent tools' gate: every tool call of a tenant (over MCP, or `bothy mcp` relayed to it) is
 * judged by its sandbox's effective policy before the tool acts (`tools` rules: the tenant's win).
 * `deny` refuses it naming the rule; `ask` holds it as an approval (kind `tool`, the arguments as
 * the excerpt) and lets it run only once a person approved. Enforced here, in the server, so no
 * prompt gets around it.
 */
import { BothyError, type EffectiveHostPolicy } from "@bothy/protocol";
import type { ToolGate, ToolRefusal } from "@bothy/tools";
import type { ApprovalOutcome } from "./contracts.ts";
import type { ApprovalBroker } from "./approvals.ts";
import { decideTool } from "./host-policy.ts";

/** What a decision through MCP elicitation says in the ledger's `reason`. */
export const VIA_ELICITATION = "through MCP elicitation";

export interface ToolGateDeps {
  approvals: Pick<ApprovalBroker, "ask" | "approve" | "deny">;
  /** A sandbox's effective policy (tenant's and its own). */
  policyOf(sandboxId: string): Promise<EffectiveHostPolicy | undefined>;
  /** The tenant's default policy alone, for a conversation that has no sandbox yet. */
  tenantPolicy(tenant: string): Promise<EffectiveHostPolicy | undefined>;
}

/** What the tool's caller is told when a call was held and not approved. */
function notApproved(tool: string, outcome: ApprovalOutcome): ToolRefusal {
  const id = outcome.approvalId;
  switch (outcome.state) {
    case "denied":
      return {
        code: "not_approved",
        message: `a person denied this call of ${tool} (approval ${id}${outcome.reason ? `: ${outcome.reason}` : ""}). Do not retry it; tell the user, or do something else.`,
      };
    case "expired":
      return {
        code: "not_approved",
        message: `nobody decided on this call of ${tool} in time (approval ${id} expired). Ask the user to approve it (bothy approvals watch) and call again.`,
      };
    default:
      return {
        code: "not_approved",
        message:
          outcome.cancelReason === "server_stopping"
            ? `the server stopped while this call of ${tool} waited for approval (${id}); call again once it is back.`
            : `this call of ${tool} was cancelled while it waited for approval (${id}); call again if it is still wanted.`,
      };
  }
}

export function toolGate(tenant: string, deps: ToolGateDeps): ToolGate {
  return async (call, signal) => {
    const policy = await (call.knownSandboxId === null
      ? deps.tenantPolicy(tenant)
      : deps.policyOf(call.knownSandboxId));
    const decision = decideTool(policy, call.tool);
    if (decision.action === "allow") return undefined;
    if (decision.action === "deny")
      return {
        code: "policy_denied",
        message: `the policy's rule ${decision.rule} denies the tool ${call.tool} in this sandbox. This is not something to retry; tell the user if the task needs it.`,
      };
    const sandboxId = call.knownSandboxId ?? (await call.sandboxId());
    const excerpt = JSON.stringify(call.args ?? {});
    // The question may also go to the MCP client's user, but only when the calling key could
    // decide it over HTTP itself: an agent's key (no approvals:decide) never approves its own call.
    const decider = call.caller?.scopes.some((s) => s === "approvals:decide" || s === "admin")
      ? call.caller
      : undefined;
    const question = new AbortController();
    const offer = async (id: string): Promise<void> => {
      const answer = await call.askUser(
        `The agent asks to run the tool ${call.tool} in sandbox ${sandboxId} (approval ${id}, rule ${decision.rule}). Arguments: ${excerpt.slice(0, 500)}${excerpt.length > 500 ? "…" : ""}`,
        question.signal,
      );
      const by = decider?.keyId ?? null;
      // An answer that finds the approval decided already (over HTTP, or expired) changes nothing.
      try {
        if (answer === "approve") await deps.approvals.approve(id, { grant: "once", reason: VIA_ELICITATION }, by);
        else if (answer === "deny") await deps.approvals.deny(id, VIA_ELICITATION, by);
      } catch (err) {
        if (!(err instanceof BothyError && err.code === "approval_not_pending")) throw err;
      }
    };
    const outcome = await deps.approvals
      .ask(
        {
          tenant,
          sandboxId,
          conversationId: call.conversationId,
          kind: "tool",
          method: null,
          host: null,
          path: null,
          tool: call.tool,
          excerpt,
          rule: decision.rule,
        },
        signal,
        decider ? (id) => void offer(id).catch(() => undefined) : undefined,
      )
      .finally(() => question.abort());
    return outcome.state === "approved" ? undefined : notApproved(call.tool, outcome);
  };
}
