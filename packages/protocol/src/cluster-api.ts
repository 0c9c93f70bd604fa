/** Several machines: the answer bodies of `/nodes` (scope admin). */
import { z } from "zod";

/** A node of the cluster as `/nodes` shows it: what it offers, what runs on it, its lease, whether it is drained. */
export const nodeInfo = z.object({
  node_id: z.string(),
  /** The URL the other nodes reach it at (its BOTHY_NODE_URL). */
  url: z.string(),
  drivers: z.array(z.string()),
  /** The templates it holds built. */
  templates: z.array(z.string()),
  /** Its host's CPUs and memory, and how many sandboxes it may run. */
  vcpu: z.number(),
  memory_mib: z.number(),
  slots: z.number(),
  /** Booted or booting sandboxes on it now. */
  sandboxes: z.number(),
  /** No new sandbox is placed on a drained node; those it runs stay until deleted. */
  draining: z.boolean(),
  /** Its lease ran out: it is down or cut off from the database, and its sandboxes show stopped. */
  lapsed: z.boolean(),
});
export type NodeInfo = z.infer<typeof nodeInfo>;
export const nodeList = z.object({ nodes: z.array(nodeInfo) });
