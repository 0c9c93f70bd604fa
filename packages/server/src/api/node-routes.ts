/**
 * `/nodes` (scope admin): the nodes of a cluster on a shared database, and draining one, so no new
 * sandbox is placed on it (cluster/placement.ts) before it is taken down; its running sandboxes
 * stay until deleted. On a single machine the list is empty.
 */
import type { FastifyInstance } from "fastify";
import { BothyError, nodeInfo, nodeList, type NodeInfo } from "@bothy/protocol";
import type { NodeLoad } from "../ledger/placement-rows.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { json } from "./route-schema.ts";

type Id = { Params: { id: string } };

const tags = ["cluster"];
const DOCS = {
  list: {
    tags,
    summary: "The cluster's nodes, their load, lease and drain (scope admin)",
    response: { 200: json(nodeList, "Nodes") },
  },
  drain: {
    tags,
    summary: "Drain a node: no new sandbox is placed on it; those it runs stay until deleted (scope admin)",
    response: { 200: json(nodeInfo, "The node, drained") },
  },
  undrain: {
    tags,
    summary: "Undo a drain: the node takes new sandboxes again (scope admin)",
    response: { 200: json(nodeInfo, "The node, taking sandboxes") },
  },
};

function shown(n: NodeLoad): NodeInfo {
  return {
    node_id: n.id,
    url: n.url,
    drivers: n.drivers,
    templates: n.templates,
    vcpu: n.vcpu,
    memory_mib: n.memory_mib,
    slots: n.slots,
    sandboxes: n.used_slots,
    draining: n.draining,
    lapsed: n.lapsed,
  };
}

export function nodeRoutes(app: FastifyInstance, ledger: LedgerStore): void {
  const one = async (id: string): Promise<NodeInfo> => {
    const found = (await ledger.placement.nodeLoads()).find((n) => n.id === id);
    if (!found) throw notFound(id);
    return shown(found);
  };
  const setDraining = async (id: string, draining: boolean): Promise<NodeInfo> => {
    if (!(await ledger.placement.setDraining(id, draining))) throw notFound(id);
    return one(id);
  };

  app.get("/nodes", { schema: DOCS.list }, async () => ({ nodes: (await ledger.placement.nodeLoads()).map(shown) }));
  app.post<Id>("/nodes/:id/drain", { schema: DOCS.drain }, async (request) => setDraining(request.params.id, true));
  app.delete<Id>("/nodes/:id/drain", { schema: DOCS.undrain }, async (request) =>
    setDraining(request.params.id, false),
  );
}

function notFound(id: string): BothyError {
  return new BothyError(
    "node_not_found",
    `No node ${JSON.stringify(id.slice(0, 64))} in this cluster; list them with GET /nodes (bothy node ls).`,
  );
}
