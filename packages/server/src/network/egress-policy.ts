/**
 * A sandbox's egress policy as a create states it: normalized once here, then stored in the ledger,
 * written into the sandbox's nft chain (nft-ruleset.ts) and judged against the operator's ceiling
 * (allow-out.ts). Pure: no host command.
 */
import type { EgressPolicy } from "../drivers/driver.ts";
import { normalizeCidr } from "./ipv4.ts";

/** The posture of a sandbox whose create said nothing about egress: the internet, nothing private. */
export const DEFAULT_POLICY: EgressPolicy = { internet: true, allowOut: [], denyOut: [] };

/** The policy a create asks for, normalized (host bits cleared, duplicates gone). */
export function egressFromRequest(req: {
  internet?: boolean | undefined;
  allow_out?: string[] | undefined;
  deny_out?: string[] | undefined;
}): EgressPolicy {
  const norm = (list: string[] | undefined): string[] => [...new Set((list ?? []).map(normalizeCidr))];
  return { internet: req.internet ?? true, allowOut: norm(req.allow_out), denyOut: norm(req.deny_out) };
}

/** Whether the policy is the default one (such a sandbox may come from the warm pool). */
export const isDefaultPolicy = (p: EgressPolicy): boolean =>
  p.internet && p.allowOut.length === 0 && p.denyOut.length === 0;
