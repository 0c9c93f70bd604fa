/**
 * The tenant's default host policy (`/policy`): rules every one of its sandboxes' requests meets
 * before the sandbox's own. Reading takes any key; setting takes the `policy` scope.
 */
import { tenantPolicyInfo, type HostPolicyRequest, type TenantPolicyInfo } from "@bothy/protocol";
import { HttpClient, type CallOptions, type ConnectionOptions } from "./http-client.ts";

export type { HostPolicyRequest, TenantPolicyInfo };

export interface PolicyOptions extends ConnectionOptions, CallOptions {
  /** Another tenant's (admin keys only). */
  tenant?: string;
}

const pathOf = (o: PolicyOptions): string =>
  o.tenant === undefined ? "/policy" : `/policy?tenant=${encodeURIComponent(o.tenant)}`;
const signalOf = (o: CallOptions): CallOptions => (o.signal ? { signal: o.signal } : {});

export const TenantPolicy = {
  async get(options: PolicyOptions = {}): Promise<TenantPolicyInfo> {
    return new HttpClient(options).json("GET", pathOf(options), tenantPolicyInfo, signalOf(options));
  },
  async set(policy: HostPolicyRequest, options: PolicyOptions = {}): Promise<TenantPolicyInfo> {
    return new HttpClient(options).json("PUT", pathOf(options), tenantPolicyInfo, {
      body: policy,
      ...signalOf(options),
    });
  },
  async clear(options: PolicyOptions = {}): Promise<TenantPolicyInfo> {
    return new HttpClient(options).json("DELETE", pathOf(options), tenantPolicyInfo, signalOf(options));
  },
};
