/**
 * MCP over streamable HTTP: one transport and one MCP server per session, keyed by the
 * `mcp-session-id` header. A session's own conversation (tool calls that name none) ends with
 * the session: its sandbox is deleted. Named conversations outlive sessions.
 */
import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { AgentTools } from "./agent-tools.ts";
import { createMcpServer } from "./mcp-server.ts";

interface Session {
  transport: StreamableHTTPServerTransport;
  server: McpServer;
}

function jsonRpcError(res: ServerResponse, status: number, message: string): void {
  res
    .writeHead(status, { "content-type": "application/json" })
    .end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message }, id: null }));
}

export class McpHttpSessions {
  private readonly sessions = new Map<string, Session>();
  private closing = false;

  constructor(private readonly tools: AgentTools) {}

  get size(): number {
    return this.sessions.size;
  }

  /** Handles POST, GET (the server's SSE stream) and DELETE (end the session) on /mcp. */
  async handle(req: IncomingMessage, res: ServerResponse, body: unknown): Promise<void> {
    const sid = req.headers["mcp-session-id"];
    if (typeof sid === "string") {
      const session = this.sessions.get(sid);
      if (!session) return jsonRpcError(res, 404, "Unknown or ended MCP session; initialize a new one.");
      return session.transport.handleRequest(req, res, body);
    }
    if (req.method !== "POST" || !isInitializeRequest(body))
      return jsonRpcError(res, 400, "No mcp-session-id: the first request of a session must be initialize (POST).");
    if (this.closing) return jsonRpcError(res, 503, "The server is stopping.");
    const server = createMcpServer(this.tools);
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => void this.sessions.set(id, { transport, server }),
    });
    transport.onclose = () => {
      const id = transport.sessionId;
      if (id && this.sessions.delete(id)) void this.endSessionConversation(id);
    };
    await server.connect(transport);
    await transport.handleRequest(req, res, body);
  }

  private async endSessionConversation(sessionId: string): Promise<void> {
    if (this.closing || !this.tools.store.conversation(sessionId)) return;
    await this.tools.deleteConversation(sessionId).catch(() => undefined);
  }

  async close(): Promise<void> {
    this.closing = true;
    await Promise.allSettled([...this.sessions.values()].map((s) => s.server.close()));
    this.sessions.clear();
  }
}
