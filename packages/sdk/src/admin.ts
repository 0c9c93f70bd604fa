/**
 * API keys, tenants and nodes (`/keys`, `/tenants`, `/nodes`): what `bothy keys`, `bothy tenants`
 * and `bothy node` use. Keys need the `keys:manage` scope (a key mints only within its own scopes);
 * tenants and nodes need `admin`.
 */
import {
  apiKeyInfo,
  createdKey,
  keyList,
  nodeInfo,
  nodeList,
  tenantDeleted,
  tenantInfo,
  tenantList,
  type ApiKeyInfo,
  type NodeInfo,
  type TenantQuota,
} from "@bothy/protocol";
import type { z } from "zod";
import { HttpClient, type CallOptions, type ConnectionOptions } from "./http-client.ts";

export type AdminOptions = ConnectionOptions & CallOptions;
export type CreatedKey = z.infer<typeof createdKey>;
export type TenantInfo = z.infer<typeof tenantInfo>;
export type { ApiKeyInfo, NodeInfo, TenantQuota };

export interface KeyCreateOptions extends AdminOptions {
  name?: string;
  /** Default: everything but keys:manage and admin that the calling key holds. */
  scopes?: string[];
  /** Only an admin key may name another tenant than its own. */
  tenant?: string;
  expiresInS?: number;
}

const signalOf = (o: CallOptions): CallOptions => (o.signal ? { signal: o.signal } : {});

export const ApiKeys = {
  /** Makes a key; the answer's `key` is the only time it is shown. */
  async create(options: KeyCreateOptions = {}): Promise<CreatedKey> {
    const body = {
      ...(options.name === undefined ? {} : { name: options.name }),
      ...(options.scopes === undefined ? {} : { scopes: options.scopes }),
      ...(options.tenant === undefined ? {} : { tenant: options.tenant }),
      ...(options.expiresInS === undefined ? {} : { expires_in_s: options.expiresInS }),
    };
    return new HttpClient(options).json("POST", "/keys", createdKey, { body, ...signalOf(options) });
  },
  async list(options: AdminOptions = {}): Promise<ApiKeyInfo[]> {
    return (await new HttpClient(options).json("GET", "/keys", keyList, signalOf(options))).keys;
  },
  /** Revokes a key by id: refused from the next request on, its open sockets and streams end. */
  async revoke(keyId: string, options: AdminOptions = {}): Promise<ApiKeyInfo> {
    return new HttpClient(options).json("DELETE", `/keys/${encodeURIComponent(keyId)}`, apiKeyInfo, signalOf(options));
  },
};

export const Tenants = {
  async create(tenant: string, quota: TenantQuota = {}, options: AdminOptions = {}): Promise<TenantInfo> {
    return new HttpClient(options).json("POST", "/tenants", tenantInfo, {
      body: { tenant, quota },
      ...signalOf(options),
    });
  },
  async list(options: AdminOptions = {}): Promise<TenantInfo[]> {
    return (await new HttpClient(options).json("GET", "/tenants", tenantList, signalOf(options))).tenants;
  },
  /**
   * Deletes a tenant that holds nothing: a ConflictError (`tenant_in_use`, naming what it holds)
   * while it has live sandboxes, unrevoked keys, secrets, volumes or snapshots.
   */
  async delete(tenant: string, options: AdminOptions = {}): Promise<{ deleted: string }> {
    return new HttpClient(options).json(
      "DELETE",
      `/tenants/${encodeURIComponent(tenant)}`,
      tenantDeleted,
      signalOf(options),
    );
  },
  /** Sets the quotas named; null lifts one. */
  async setQuota(tenant: string, quota: TenantQuota, options: AdminOptions = {}): Promise<TenantInfo> {
    return new HttpClient(options).json("PATCH", `/tenants/${encodeURIComponent(tenant)}/quota`, tenantInfo, {
      body: quota,
      ...signalOf(options),
    });
  },
};

/** The nodes of a cluster (`/nodes`, scope admin): list them, drain one before taking it down, undo a drain. */
export const Nodes = {
  async list(options: AdminOptions = {}): Promise<NodeInfo[]> {
    return (await new HttpClient(options).json("GET", "/nodes", nodeList, signalOf(options))).nodes;
  },
  /** No new sandbox is placed on the node; those it runs stay until deleted. */
  async drain(nodeId: string, options: AdminOptions = {}): Promise<NodeInfo> {
    return new HttpClient(options).json(
      "POST",
      `/nodes/${encodeURIComponent(nodeId)}/drain`,
      nodeInfo,
      signalOf(options),
    );
  },
  async undrain(nodeId: string, options: AdminOptions = {}): Promise<NodeInfo> {
    return new HttpClient(options).json(
      "DELETE",
      `/nodes/${encodeURIComponent(nodeId)}/drain`,
      nodeInfo,
      signalOf(options),
    );
  },
};
