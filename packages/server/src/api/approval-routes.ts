/**
 * `/approvals` (scope approvals:decide, which agent and sandbox keys never get): list, show,
 * approve and deny what an `ask` rule holds. A key sees its own tenant's approvals (an admin key
 * every tenant's); another tenant's approval is answered exactly as an unknown one.
 */
import type { FastifyInstance, FastifyRequest } from "fastify";
import {
  APPROVAL_ID_RE,
  approvalInfo,
  approvalList,
  approvalListQuery,
  decideApprovalRequest,
  type ApprovalInfo,
} from "@bothy/protocol";
import { principalOf, sees } from "../auth/auth-hooks.ts";
import { approvalNotFound, type ApprovalBroker } from "../gateway/approvals.ts";
import { parseInput } from "./parse-input.ts";
import { json } from "./route-schema.ts";

type Id = { Params: { id: string } };

/** A denial takes a reason only. */
export const denyApprovalRequest = decideApprovalRequest.pick({ reason: true });

const tags = ["approvals"];
const DOCS = {
  list: {
    tags,
    summary:
      "Approvals an `ask` rule made, newest first: the tenant's (every tenant's for an admin key); filter by state and sandbox (scope approvals:decide)",
    querystring: approvalListQuery,
    response: { 200: json(approvalList, "Approvals") },
  },
  show: {
    tags,
    summary: "One approval (scope approvals:decide)",
    response: { 200: json(approvalInfo, "The approval") },
  },
  approve: {
    tags,
    summary:
      "Approve a pending approval: the held request goes out once (grant `host` with `minutes`: the sandbox's requests to that host pass that long). A decided one answers 409 approval_not_pending",
    body: decideApprovalRequest,
    response: { 200: json(approvalInfo, "The approval, approved") },
  },
  deny: {
    tags,
    summary:
      "Deny a pending approval: the held request is refused (403) or the tool call fails. A decided one answers 409 approval_not_pending",
    body: denyApprovalRequest,
    response: { 200: json(approvalInfo, "The approval, denied") },
  },
};

export function approvalRoutes(app: FastifyInstance, broker: ApprovalBroker): void {
  /** The approval the request names, if the caller's key may see it; else the unknown id's 404. */
  const visible = async (request: FastifyRequest<Id>): Promise<ApprovalInfo> => {
    const { id } = request.params;
    const found = APPROVAL_ID_RE.test(id) ? await broker.get(id) : undefined;
    if (!found || !sees(principalOf(request), found.tenant)) throw approvalNotFound(id);
    return found;
  };

  app.get<{ Querystring: Record<string, string> }>("/approvals", { schema: DOCS.list }, async (request) => {
    const principal = principalOf(request);
    const query = parseInput(approvalListQuery, request.query, "GET /approvals");
    return {
      approvals: await broker.list({
        ...(principal.scopes.has("admin") ? {} : { tenant: principal.tenant }),
        ...(query.state === undefined ? {} : { state: query.state }),
        ...(query.sandbox_id === undefined ? {} : { sandboxId: query.sandbox_id }),
        limit: query.limit,
      }),
    };
  });

  app.get<Id>("/approvals/:id", { schema: DOCS.show }, async (request) => visible(request));

  app.post<Id>("/approvals/:id/approve", { schema: DOCS.approve }, async (request) => {
    const body = parseInput(decideApprovalRequest, request.body, "POST /approvals/{id}/approve");
    const { approval_id: id } = await visible(request);
    return broker.approve(id, body, principalOf(request).keyId);
  });

  app.post<Id>("/approvals/:id/deny", { schema: DOCS.deny }, async (request) => {
    const body = parseInput(denyApprovalRequest, request.body, "POST /approvals/{id}/deny");
    const { approval_id: id } = await visible(request);
    return broker.deny(id, body.reason, principalOf(request).keyId);
  });
}
