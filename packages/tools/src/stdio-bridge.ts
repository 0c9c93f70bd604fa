/**
 * `bothy mcp`: MCP over stdio, relayed message by message to a bothy server's `/mcp` (streamable
 * HTTP), so conversations, exports and the corpus live in the server whichever transport a
 * client uses. Requests, responses and notifications (progress, logs) pass through unchanged.
 */
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { isJSONRPCRequest, isJSONRPCResultResponse, type JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js";

export interface BridgeOptions {
  /** The bothy server, e.g. http://127.0.0.1:8080 */
  url: string;
  /** Every tool call of this process belongs to this conversation (else: the MCP session's own). */
  conversationId?: string | undefined;
  /** Sent as `Authorization: Bearer`; default BOTHY_API_KEY. */
  apiKey?: string | undefined;
  input?: NodeJS.ReadableStream;
  output?: NodeJS.WritableStream;
}

/** Runs until stdin closes; answers the process exit code. */
export async function runStdioBridge(options: BridgeOptions): Promise<number> {
  const apiKey = options.apiKey ?? process.env["BOTHY_API_KEY"];
  const headers: Record<string, string> = {
    ...(options.conversationId ? { "bothy-conversation-id": options.conversationId } : {}),
    ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}),
  };
  const upstream = new StreamableHTTPClientTransport(new URL("/mcp", options.url), { requestInit: { headers } });
  const local = new StdioServerTransport(
    options.input as NodeJS.ReadStream | undefined,
    options.output as NodeJS.WriteStream | undefined,
  );
  const initializeIds = new Set<string | number>();
  let done: (code: number) => void = () => undefined;
  const finished = new Promise<number>((resolve) => (done = resolve));

  local.onmessage = (message: JSONRPCMessage) => {
    if (isJSONRPCRequest(message) && message.method === "initialize") initializeIds.add(message.id);
    upstream.send(message).catch((err: unknown) => {
      // The server could not be reached: answer the request so the client does not wait forever.
      if (isJSONRPCRequest(message)) {
        void local.send({
          jsonrpc: "2.0",
          id: message.id,
          error: {
            code: -32603,
            message: `bothy server at ${options.url} unreachable: ${err instanceof Error ? err.message : String(err)}`,
          },
        });
      }
    });
  };
  upstream.onmessage = (message: JSONRPCMessage) => {
    if (isJSONRPCResultResponse(message) && initializeIds.delete(message.id)) {
      const version = (message.result as { protocolVersion?: unknown }).protocolVersion;
      if (typeof version === "string") upstream.setProtocolVersion(version);
    }
    void local.send(message);
  };
  upstream.onerror = (err) => process.stderr.write(`bothy mcp: ${err.message}\n`);
  local.onclose = () => {
    void upstream
      .terminateSession()
      .catch(() => undefined)
      .finally(() => upstream.close().finally(() => done(0)));
  };
  await upstream.start();
  await local.start();
  (options.input ?? process.stdin).on("end", () => void local.close());
  return finished;
}
