export {
  AgentTools,
  CONVERSATION_ID_RE,
  type AgentToolsOptions,
  type ConversationShape,
  type ExportView,
  type TurnView,
  type ToolLog,
  type ToolCall,
  type ToolGate,
  type ToolRefusal,
} from "./agent-tools.ts";
export { CORPUS_MEDIA_TYPES, corpusMediaType, passagesOf, ftsQuery, type CorpusMediaType } from "./corpus.ts";
export { GUIDANCE, DESCRIPTIONS, FRAGMENT_NOTICE } from "./guidance.ts";
export { createMcpServer, TOOL_NAMES } from "./mcp-server.ts";
export { McpHttpSessions } from "./mcp-http.ts";
export { runStdioBridge, type BridgeOptions } from "./stdio-bridge.ts";
export { META_CONVERSATION, META_TURN } from "./tool-context.ts";
export { UNTRUSTED_META, untrustedText } from "./tool-result.ts";
export { numberedLines, truncateMiddle, MiddleTruncator, mediaTypeOf, imageType } from "./text-view.ts";
