/**
 * Approvals (`/approvals`, scope approvals:decide): what an `ask` rule of a host policy holds (a
 * request through the egress gateway, or an agent tool's call) until a person decides.
 */
import { approvalInfo, approvalList, type ApprovalInfo, type ApprovalState } from "@bothy/protocol";
import { HttpClient, type CallOptions } from "./http-client.ts";
import type { AdminOptions } from "./admin.ts";

export type { ApprovalInfo, ApprovalState };

export interface ApprovalListOptions extends AdminOptions {
  state?: ApprovalState;
  sandboxId?: string;
  limit?: number;
}

export interface ApproveOptions extends AdminOptions {
  /** Also let the sandbox's requests to the same host through for this many minutes (grant `host`). */
  hostMinutes?: number;
  reason?: string;
}

export interface DenyOptions extends AdminOptions {
  reason?: string;
}

const signalOf = (o: CallOptions): CallOptions => (o.signal ? { signal: o.signal } : {});
const path = (id: string, verb = ""): string => `/approvals/${encodeURIComponent(id)}${verb}`;

export const Approvals = {
  /** Newest first: the key's tenant's (every tenant's for an admin key). */
  async list(options: ApprovalListOptions = {}): Promise<ApprovalInfo[]> {
    const query = { state: options.state, sandbox_id: options.sandboxId, limit: options.limit };
    return (await new HttpClient(options).json("GET", "/approvals", approvalList, { query, ...signalOf(options) }))
      .approvals;
  },
  async get(id: string, options: AdminOptions = {}): Promise<ApprovalInfo> {
    return new HttpClient(options).json("GET", path(id), approvalInfo, signalOf(options));
  },
  /** The held request goes out once; a decided approval throws ConflictError (approval_not_pending). */
  async approve(id: string, options: ApproveOptions = {}): Promise<ApprovalInfo> {
    const body = {
      ...(options.hostMinutes === undefined ? { grant: "once" } : { grant: "host", minutes: options.hostMinutes }),
      ...(options.reason === undefined ? {} : { reason: options.reason }),
    };
    return new HttpClient(options).json("POST", path(id, "/approve"), approvalInfo, { body, ...signalOf(options) });
  },
  async deny(id: string, options: DenyOptions = {}): Promise<ApprovalInfo> {
    const body = options.reason === undefined ? {} : { reason: options.reason };
    return new HttpClient(options).json("POST", path(id, "/deny"), approvalInfo, { body, ...signalOf(options) });
  },
};
