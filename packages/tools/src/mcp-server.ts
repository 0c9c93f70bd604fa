/** The MCP server: every tool, the guidance as instructions and as the `computer_guidance` prompt. */
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { AgentTools } from "./agent-tools.ts";
import { GUIDANCE } from "./guidance.ts";
import { registerCheckpointTools } from "./tools/checkpoint-tools.ts";
import { registerComputerBash } from "./tools/computer-bash.ts";
import { registerCorpusTools } from "./tools/corpus-tools.ts";
import { registerDeliveryTools } from "./tools/delivery-tools.ts";
import { registerDesktopTools } from "./tools/desktop-tools.ts";
import { registerFileTools } from "./tools/file-tools.ts";

export const TOOL_NAMES = [
  "computer_bash",
  "computer_read_file",
  "computer_edit_file",
  "computer_write_file",
  "computer_view_file",
  "computer_export_file",
  "send_file",
  "computer_fetch_document",
  "rag_search",
  "computer_screenshot",
  "computer_click",
  "computer_move",
  "computer_type",
  "computer_key",
  "computer_scroll",
  "computer_checkpoint",
  "computer_restore",
] as const;

/** One MCP server per session (the SDK binds a server to one transport). */
export function createMcpServer(tools: AgentTools): McpServer {
  const server = new McpServer(
    { name: "bothy", version: "0.1.0" },
    // Strict: a request to the client (elicitation) that it did not declare fails here instead of being sent.
    { instructions: GUIDANCE, capabilities: { logging: {} }, enforceStrictCapabilities: true },
  );
  // Work that outlives a tool call (watching a background command) stops with the session.
  const session = new AbortController();
  server.server.onclose = () => session.abort();
  registerComputerBash(server, tools, session.signal);
  registerFileTools(server, tools);
  registerDeliveryTools(server, tools);
  registerCorpusTools(server, tools);
  registerDesktopTools(server, tools);
  registerCheckpointTools(server, tools);
  server.registerPrompt(
    "computer_guidance",
    {
      title: "How to use the computer tools",
      description:
        "Read before edit, view charts before claiming success, export then send, totals need the whole file, aggregate big files in SQL.",
    },
    () => ({ messages: [{ role: "user", content: { type: "text", text: GUIDANCE } }] }),
  );
  return server;
}
