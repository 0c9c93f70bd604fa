import { Nodes, type NodeInfo } from "@bothy/sdk";
import { connection, JSON_FLAG, UsageError } from "../args/parse.ts";
import { subcommandsCommand } from "../command.ts";
import { printJson, printTable } from "../output.ts";

const USAGE = `usage: bothy node ls [--json]
       bothy node drain ID [--json]
       bothy node undrain ID [--json]

The nodes of a cluster on one PostgreSQL (scope admin). A drained node gets no new sandbox (creates
are placed on the others); the sandboxes it runs stay until deleted. Drain a node before taking it
down; undrain it once it is back.
`;

function print(nodes: NodeInfo[]): void {
  printTable(
    ["NODE", "URL", "SANDBOXES", "SLOTS", "STATE"],
    nodes.map((n) => [
      n.node_id,
      n.url,
      String(n.sandboxes),
      String(n.slots),
      n.lapsed ? "lapsed" : n.draining ? "draining" : "ready",
    ]),
  );
}

export const nodeCommand = subcommandsCommand({
  name: "node",
  summary: "list a cluster's nodes, drain one or undo a drain",
  usage: USAGE,
  options: JSON_FLAG,
  positionals: { min: 0, max: 1, names: "node id" },
  async run(sub, { values, positionals }) {
    const conn = connection(values);
    const [id] = positionals;
    let shown: NodeInfo[];
    if (sub === "ls" || sub === "list") shown = await Nodes.list(conn);
    else if (sub === "drain" || sub === "undrain") {
      if (id === undefined) throw new UsageError("missing node id (bothy node ls lists them)");
      shown = [sub === "drain" ? await Nodes.drain(id, conn) : await Nodes.undrain(id, conn)];
    } else throw new UsageError(`unknown subcommand ${sub}`);
    if (values.json) printJson(sub === "ls" || sub === "list" ? { nodes: shown } : shown[0]);
    else print(shown);
    return 0;
  },
});
