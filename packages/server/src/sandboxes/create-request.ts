import { BothyError, createSandboxRequest, TEMPLATE_NAME_RE, type NetworkPolicy } from "@bothy/protocol";
import type { Config } from "../config.ts";
import type { EgressPolicy } from "../drivers/driver.ts";
import { needsGateway } from "../gateway/host-policy.ts";
import type { GatewayPolicies, SandboxPolicyRecord } from "../gateway/policies.ts";
import { checkAllowOut } from "../network/allow-out.ts";
import { egressFromRequest } from "../network/egress-policy.ts";
import { lifetimeOf } from "./lifetime.ts";

export type CreateRequest = ReturnType<typeof createSandboxRequest.parse>;

/**
 * A create's body, checked against the schema and what this host allows (limits, lifetime,
 * network; `mayOpenPrivate`: the key holds `network:private`); a refusal says what to change.
 */
export function parseCreateRequest(
  body: unknown,
  config: Config,
  hasVault: boolean,
  mayOpenPrivate: boolean,
): CreateRequest {
  const parsed = createSandboxRequest.safeParse(body ?? {});
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const where = issue?.path.length ? `${issue.path.join(".")}: ` : "";
    throw new BothyError(
      "invalid_request",
      `${where}${issue?.message ?? "invalid body"}. Expected {"template":"seed","vcpu":1,"memory_mib":1024}.`,
    );
  }
  const req = parsed.data;
  const { limits } = config;
  if (!TEMPLATE_NAME_RE.test(req.template)) {
    throw new BothyError(
      "invalid_template_name",
      "Template names are lowercase letters, digits and '-', starting with a letter or digit (e.g. \"seed\").",
    );
  }
  if (req.vcpu < limits.minVcpu || req.vcpu > limits.maxVcpu) {
    throw new BothyError(
      "invalid_request",
      `vcpu must be between ${limits.minVcpu} and ${limits.maxVcpu} on this host.`,
    );
  }
  if (req.memory_mib < limits.minMemoryMib || req.memory_mib > limits.maxMemoryMib) {
    throw new BothyError(
      "invalid_request",
      `memory_mib must be between ${limits.minMemoryMib} and ${limits.maxMemoryMib} on this host.`,
    );
  }
  if (req.disk_mib !== undefined && (req.disk_mib < limits.minDiskMib || req.disk_mib > limits.maxDiskMib)) {
    throw new BothyError(
      "invalid_request",
      `disk_mib must be between ${limits.minDiskMib} and ${limits.maxDiskMib} on this host.`,
    );
  }
  if (
    req.max_processes !== undefined &&
    (req.max_processes < limits.minProcesses || req.max_processes > limits.maxProcesses)
  ) {
    throw new BothyError(
      "invalid_request",
      `max_processes must be between ${limits.minProcesses} and ${limits.maxProcesses} on this host.`,
    );
  }
  lifetimeOf(req, config.lifecycle);
  refuseNetworkRequest(req, config.network.enabled, hasVault);
  if (config.network.enabled && req.allow_out !== undefined) {
    const { pool, extraBlocked, allowOutPermit: permit } = config.network;
    checkAllowOut(egressFromRequest(req).allowOut, { pool, extraBlocked, permit }, mayOpenPrivate);
  }
  return req;
}

/** Refuses what this server cannot give a sandbox's network: a secret or a rule must never be silently left out. */
function refuseNetworkRequest(req: CreateRequest, enabled: boolean, hasVault: boolean): void {
  if (req.secrets !== undefined && req.secrets.length > 0 && !hasVault)
    throw new BothyError("not_supported", "This server has no secrets vault; create the sandbox without `secrets`.");
  const { tools: _tools, ...hostRules } = req.policy ?? {};
  if (!enabled && (Object.keys(hostRules).length > 0 || req.secrets !== undefined))
    throw new BothyError(
      "not_supported",
      "Networking is off on this host (BOTHY_NETWORK=off): sandboxes have no network, so host rules and secrets cannot be given (tool rules can).",
    );
  if (!enabled && (req.allow_out?.length || req.internet === true)) {
    throw new BothyError(
      "not_supported",
      "Networking is off on this host (BOTHY_NETWORK=off): sandboxes have no network, so internet and allow_out cannot be given.",
    );
  }
}

/**
 * The egress a (validated) request asks for, the policy shown on the sandbox, and what its row
 * keeps for the gateway. Under a host policy (its own or its tenant's) its HTTP(S) passes the gateway.
 */
export async function networkPolicy(
  req: CreateRequest,
  tenant: string,
  network: Config["network"],
  policies: GatewayPolicies,
): Promise<{ egress: EgressPolicy; shown: NetworkPolicy; record: SandboxPolicyRecord | undefined }> {
  const egress = egressFromRequest(req);
  const record =
    req.policy === undefined && req.secrets === undefined
      ? undefined
      : { ...(req.policy ? { policy: req.policy } : {}), ...(req.secrets ? { secrets: req.secrets } : {}) };
  const { enabled, dns } = network;
  const gateway = enabled && needsGateway(await policies.effective(tenant, record ?? {}));
  return {
    egress: { ...egress, gateway },
    shown: {
      enabled,
      internet: enabled && egress.internet,
      allow_out: egress.allowOut,
      deny_out: egress.denyOut,
      dns: enabled ? dns : [],
    },
    record,
  };
}
