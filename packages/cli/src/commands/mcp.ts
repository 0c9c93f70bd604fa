/**
 * `bothy mcp [--url URL] [--conversation ID]`: the agent tools over MCP on stdio, for MCP clients
 * that start a local process. Messages are relayed to the server's /mcp, where the tools run.
 */
import { runStdioBridge } from "@bothy/tools";

const USAGE = `usage: bothy mcp [--url URL] [--conversation ID]

Speaks MCP on stdin/stdout and relays it to a bothy server's /mcp endpoint, with the key in
BOTHY_API_KEY (on the server's host, $BOTHY_HOME/admin.key when that is unset).

  --url URL            the bothy server (default $BOTHY_URL, else http://127.0.0.1:8080)
  --conversation ID    tool calls belong to this conversation (its sandbox and files persist
                       across sessions); default: one conversation per session, deleted with it
`;

export async function mcp(args: string[]): Promise<number> {
  let url = process.env["BOTHY_URL"] ?? "http://127.0.0.1:8080";
  let conversationId: string | undefined;
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    const value = args[i + 1];
    if ((arg === "--url" || arg === "--conversation") && value !== undefined) {
      if (arg === "--url") url = value;
      else conversationId = value;
      i++;
    } else {
      process.stderr.write(arg === "--help" ? USAGE : `bothy mcp: unexpected ${arg ?? ""}\n${USAGE}`);
      return arg === "--help" ? 0 : 2;
    }
  }
  return runStdioBridge({ url, conversationId });
}
