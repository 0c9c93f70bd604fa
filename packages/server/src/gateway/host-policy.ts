/**
 * Host policies: what the egress gateway does with one request. A sandbox's effective policy is
 * its tenant's rules, then its own, then a default; the first rule whose host, method and path
 * match decides. Pure functions, so the proxy, the tools and the API all judge alike.
 */
import {
  hostPolicyRequest,
  type EffectiveHostPolicy,
  type EgressAction,
  type HostPolicyRequest,
  type HostRule,
} from "@bothy/protocol";
import type { z } from "zod";
import { judgedPath } from "./request-path.ts";

type ParsedPolicy = z.output<typeof hostPolicyRequest>;

/** What a request is judged by; `method` and `path` are null when the gateway cannot see them (HTTPS it does not terminate). */
export interface EgressRequest {
  host: string;
  method: string | null;
  path: string | null;
}

export interface Decision {
  action: EgressAction;
  /** `tenant#0`, `sandbox#2`, or `default`. */
  rule: string;
  /**
   * Set when the rule judges paths and the request's path has no single reading (request-path.ts):
   * the request is refused (`action` is `deny`), whatever the rule's own action.
   */
  ambiguousPath?: string;
}

/** `*.example.com` matches names below example.com, never example.com itself; others match exactly. */
export function hostMatches(pattern: string, host: string): boolean {
  const name = host.toLowerCase().replace(/\.$/, "");
  if (pattern.startsWith("*.")) return name.endsWith(pattern.slice(1)) && name.length > pattern.length - 1;
  return name === pattern;
}

/**
 * A path rule is a prefix in which `*` stands for any characters but `/`. `path` is the judged
 * path (request-path.ts: no query, escapes decoded, dot segments resolved).
 */
export function pathMatches(pattern: string, path: string): boolean {
  const re = new RegExp(
    "^" +
      pattern
        .split("*")
        .map((part) => part.replace(/[.+?^${}()|[\]\\]/g, "\\$&"))
        .join("[^/]*"),
  );
  return re.test(path);
}

/** The rules a policy as asked for stands for, in evaluation order: `rules`, `deny_hosts`, `allow_hosts`. */
export function expandRules(p: ParsedPolicy): HostRule[] {
  return [
    ...(p.rules ?? []),
    ...(p.deny_hosts ?? []).map((host): HostRule => ({ host, action: "deny" })),
    ...(p.allow_hosts ?? []).map((host): HostRule => ({ host, action: "allow" })),
  ];
}

/** The default a policy names, or the one it implies: `deny` once it allows something by name. */
export function impliedDefault(p: ParsedPolicy): EgressAction | undefined {
  if (p.default) return p.default;
  if ((p.allow_hosts?.length ?? 0) > 0 || (p.rules ?? []).some((r) => r.action === "allow")) return "deny";
  return undefined;
}

/** Parses a policy as stored or asked for (throws zod's error on a bad one). */
export const parseHostPolicy = (raw: HostPolicyRequest | unknown): ParsedPolicy => hostPolicyRequest.parse(raw);

/**
 * A sandbox's effective policy from its tenant's default and its own, or undefined when neither
 * says anything (its HTTP(S) then does not pass the gateway at all).
 */
export function effectivePolicy(
  tenant: ParsedPolicy | undefined,
  sandbox: ParsedPolicy | undefined,
  secrets: readonly string[] = [],
): EffectiveHostPolicy | undefined {
  const tenantRules = tenant ? expandRules(tenant) : [];
  const sandboxRules = sandbox ? expandRules(sandbox) : [];
  const def = (sandbox && impliedDefault(sandbox)) ?? (tenant && impliedDefault(tenant));
  const tools = { ...tenant?.tools, ...sandbox?.tools, ...tenant?.tools };
  if (
    tenantRules.length === 0 &&
    sandboxRules.length === 0 &&
    def === undefined &&
    secrets.length === 0 &&
    Object.keys(tools).length === 0
  )
    return undefined;
  return {
    rules: [
      ...tenantRules.map((r, index) => ({ ...r, source: "tenant" as const, index })),
      ...sandboxRules.map((r, index) => ({ ...r, source: "sandbox" as const, index })),
    ],
    default: def ?? "allow",
    tools,
    secrets: [...secrets],
  };
}

/** True when a request to `host` could meet a rule with methods or a path: HTTPS to it must be terminated to judge it. */
export function needsRequestView(policy: EffectiveHostPolicy, host: string): boolean {
  return policy.rules.some((r) => (r.methods !== undefined || r.path !== undefined) && hostMatches(r.host, host));
}

/**
 * The first matching rule's action. A rule with methods or a path matches only a request whose
 * method and path are seen; where they are not (HTTPS passed through), such a rule is skipped.
 * Paths are judged as servers read them (request-path.ts); when a path has no single reading (an
 * ambiguous encoding, or `.`, `..`, `//` or `;` that lead to another rule unresolved than
 * resolved), the first path rule the request meets refuses it.
 */
export function decide(policy: EffectiveHostPolicy, req: EgressRequest): Decision {
  if (req.path === null) return firstRule(policy, req, null);
  const judged = judgedPath(req.path);
  if (!judged.ok) return firstRule(policy, req, { problem: judged.problem });
  const canonical = firstRule(policy, req, judged.path);
  for (const reading of judged.readings) {
    const other = firstRule(policy, req, reading);
    if (other.action === canonical.action && other.rule === canonical.rule) continue;
    const problem = `read as ${judged.path} it meets ${canonical.rule}, read as ${reading} (its . , .. , // or ; kept) ${other.rule}`;
    return firstRule(policy, req, { problem });
  }
  return canonical;
}

/** The first rule that matches with the path read as `path`; `problem`: the path cannot be read, a path rule refuses it. */
function firstRule(
  policy: EffectiveHostPolicy,
  req: EgressRequest,
  path: string | null | { problem: string },
): Decision {
  for (const r of policy.rules) {
    if (!hostMatches(r.host, req.host)) continue;
    if (r.methods !== undefined && (req.method === null || !r.methods.includes(req.method.toUpperCase()))) continue;
    const rule = `${r.source}#${r.index}`;
    if (r.path !== undefined) {
      if (path === null) continue;
      if (typeof path !== "string") return { action: "deny", rule, ambiguousPath: path.problem };
      if (!pathMatches(r.path, path)) continue;
    }
    return { action: r.action, rule };
  }
  return { action: policy.default, rule: "default" };
}

/** A tool call's action: the tools map (tenant's entries win), else allow. */
export function decideTool(policy: EffectiveHostPolicy | undefined, tool: string): Decision {
  const action = policy?.tools[tool];
  return action === undefined ? { action: "allow", rule: "default" } : { action, rule: `tools.${tool}` };
}

/** Whether a sandbox's HTTP(S) must pass the gateway: some host rule, a default other than allow, or a secret. */
export const needsGateway = (p: EffectiveHostPolicy | undefined): boolean =>
  p !== undefined && (p.rules.length > 0 || p.default !== "allow" || p.secrets.length > 0);
