/**
 * The tenant's secrets vault (`/secrets`, scope `secrets`): what `bothy secrets` uses. Write-only:
 * a value goes in with `put` and no call ever returns it; a sandbox created with `secrets: [name]`
 * sees a placeholder, which the egress gateway swaps for the value on the bound hosts only.
 */
import { secretInfo, secretList, type SecretInfo } from "@bothy/protocol";
import { HttpClient, type CallOptions, type ConnectionOptions } from "./http-client.ts";

export type { SecretInfo };

export interface SecretOptions extends ConnectionOptions, CallOptions {
  /** Only an admin key may name another tenant than its own. */
  tenant?: string;
}

export interface SecretPutOptions extends SecretOptions {
  /** The only hosts (exact names or `*.example.com`) the value is ever sent to. */
  hosts: string[];
  /** Set this header on every request to those hosts (`format` holds `{value}`); omitted: the placeholder is swapped wherever it appears in a header. */
  inject?: { header: string; format?: string };
}

const signalOf = (o: CallOptions): CallOptions => (o.signal ? { signal: o.signal } : {});
const query = (o: SecretOptions): string => (o.tenant === undefined ? "" : `?tenant=${encodeURIComponent(o.tenant)}`);
const path = (name: string, o: SecretOptions): string => `/secrets/${encodeURIComponent(name)}${query(o)}`;

export const Secrets = {
  /** Stores (or replaces) a secret; the answer describes it without its value. */
  async put(name: string, value: string, options: SecretPutOptions): Promise<SecretInfo> {
    const body = { value, hosts: options.hosts, ...(options.inject === undefined ? {} : { inject: options.inject }) };
    return new HttpClient(options).json("PUT", path(name, options), secretInfo, { body, ...signalOf(options) });
  },
  async list(options: SecretOptions = {}): Promise<SecretInfo[]> {
    return (await new HttpClient(options).json("GET", `/secrets${query(options)}`, secretList, signalOf(options)))
      .secrets;
  },
  async get(name: string, options: SecretOptions = {}): Promise<SecretInfo> {
    return new HttpClient(options).json("GET", path(name, options), secretInfo, signalOf(options));
  },
  /** Removes it; sandboxes bound to it keep a placeholder that the gateway sends nowhere. */
  async delete(name: string, options: SecretOptions = {}): Promise<SecretInfo> {
    return new HttpClient(options).json("DELETE", path(name, options), secretInfo, signalOf(options));
  },
};
