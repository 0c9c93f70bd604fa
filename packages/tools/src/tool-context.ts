/**
 * What every tool call shares: which conversation and turn it belongs to, that conversation's
 * sandbox, and how errors become results the model can act on.
 */
import { createHash } from "node:crypto";
import { posix } from "node:path";
import type { RequestHandlerExtra } from "@modelcontextprotocol/sdk/shared/protocol.js";
import {
  ElicitResultSchema,
  type CallToolResult,
  type ServerNotification,
  type ServerRequest,
} from "@modelcontextprotocol/sdk/types.js";
import { BothyError } from "@bothy/protocol";
import type { Sandbox } from "@bothy/sdk";
import type { AgentTools } from "./agent-tools.ts";
import { asBothyError } from "./sandbox-calls.ts";
import { refusal } from "./tool-result.ts";

export type Extra = RequestHandlerExtra<ServerRequest, ServerNotification>;

/** `_meta` keys (or the same names as HTTP headers, `bothy-conversation-id`) a client sets on tool calls. */
export const META_CONVERSATION = "bothy/conversation_id";
export const META_TURN = "bothy/turn_id";

export interface CallContext {
  tools: AgentTools;
  conversationId: string;
  turnId: string;
  extra: Extra;
  /** The conversation's sandbox, created on first use. */
  sandbox(): Promise<Sandbox>;
}

/** `s` as one word for a POSIX shell. */
export function shellQuote(s: string): string {
  return `'${s.replaceAll("'", `'\\''`)}'`;
}

/** Resolves a path as the guest does: relative ones from /workspace. */
export function resolvePath(path: string): string {
  return posix.resolve("/workspace", path);
}

function fromRequest(extra: Extra, key: string): string | undefined {
  const meta = extra._meta as Record<string, unknown> | undefined;
  const fromMeta = meta?.[key];
  if (typeof fromMeta === "string") return fromMeta;
  const header = extra.requestInfo?.headers[key.replaceAll("/", "-").replaceAll("_", "-")];
  return typeof header === "string" ? header : undefined;
}

/** The conversation a call belongs to: named in `_meta` or a header, else the MCP session's own. */
export function conversationOf(extra: Extra): string | undefined {
  return fromRequest(extra, META_CONVERSATION) ?? extra.sessionId;
}

export type ToolHandler<A> = (args: A, ctx: CallContext) => Promise<CallToolResult>;

/**
 * Wraps a tool: resolves conversation, turn and sandbox; asks the tools' gate (the server's
 * policy) before the tool acts; answers with the ids in `_meta`, and turns errors into refusals
 * that say what to do (never a stack trace).
 */
export function withContext<A>(
  tools: AgentTools,
  name: string,
  handler: ToolHandler<A>,
): (args: A, extra: Extra) => Promise<CallToolResult> {
  return async (args, extra) => {
    const conversationId = conversationOf(extra);
    if (!conversationId)
      return refusal(
        "sandbox_error",
        'This call belongs to no conversation: pass _meta["bothy/conversation_id"] or use a session.',
      );
    const notes: string[] = [];
    let result: CallToolResult;
    let turnId = "";
    try {
      if (!tools.store.conversation(conversationId)) tools.createConversation({ conversation_id: conversationId });
      turnId = tools.turnForCall(conversationId, fromRequest(extra, META_TURN));
      const ctx: CallContext = {
        tools,
        conversationId,
        turnId,
        extra,
        sandbox: async () => {
          const lease = await tools.sandboxFor(conversationId);
          if (lease.replaced)
            notes.push(
              "Note: this conversation's previous sandbox was gone (expired or the server restarted), so a new, empty one was made; files from earlier turns are not in it.",
            );
          return lease.sandbox;
        },
      };
      const refused = await tools.gate(
        {
          tool: name,
          conversationId,
          args,
          knownSandboxId: tools.store.conversation(conversationId)?.sandbox_id ?? null,
          sandboxId: async () => (await ctx.sandbox()).sandboxId,
          caller: extra.authInfo && {
            keyId: extra.authInfo.clientId === "" ? null : extra.authInfo.clientId,
            scopes: extra.authInfo.scopes,
          },
          askUser: (message, signal) => askUser(extra, message, signal),
        },
        extra.signal,
      );
      result = refused ? refusal(refused.code, refused.message) : await handler(args, ctx);
    } catch (err) {
      result = errorResult(err);
    }
    if (notes.length > 0) result.content = [...result.content, { type: "text", text: notes.join("\n") }];
    result._meta = { ...result._meta, [META_CONVERSATION]: conversationId, [META_TURN]: turnId };
    return result;
  };
}

/**
 * One yes-or-no question to the client's user over MCP elicitation. The server is strict about
 * capabilities (mcp-server.ts), so a client that declared no elicitation is never sent one: the
 * request fails at once, as does one the call's end cancelled; both are "no answer".
 */
async function askUser(extra: Extra, message: string, signal: AbortSignal): Promise<"approve" | "deny" | undefined> {
  let result;
  try {
    result = await extra.sendRequest(
      {
        method: "elicitation/create",
        params: {
          mode: "form",
          message,
          requestedSchema: {
            type: "object",
            properties: { approve: { type: "boolean", title: "Approve", description: "Let this call run once" } },
            required: ["approve"],
          },
        },
      },
      ElicitResultSchema,
      { signal, timeout: 24 * 3600 * 1000 },
    );
  } catch {
    return undefined;
  }
  if (result.action === "cancel") return undefined;
  return result.action === "accept" && result.content?.["approve"] === true ? "approve" : "deny";
}

export function errorResult(thrown: unknown): CallToolResult {
  // The server's own codes, whether the tools threw them or the SDK rebuilt them from an answer.
  const err = asBothyError(thrown);
  if (!(err instanceof BothyError))
    return refusal(
      "sandbox_error",
      "The tool failed with an internal error (the server log has it); try again, or try another way.",
    );
  switch (err.code) {
    case "file_not_found":
      return refusal(
        "not_found",
        `${err.message} Check the path (relative paths start at /workspace); list a directory with computer_bash (ls -la DIR).`,
      );
    case "precondition_failed":
      return refusal(
        "changed_since_read",
        "the file changed since you read it in this turn. Read it again with computer_read_file and redo the change against its current content.",
      );
    case "turn_ended":
      return refusal("turn_ended", err.message);
    case "export_not_found":
      return refusal("unknown_export", err.message);
    case "document_not_found":
      return refusal("unknown_document", err.message);
    case "snapshot_not_found":
      return refusal("unknown_checkpoint", err.message);
    default:
      return refusal("sandbox_error", `${err.message} (${err.code})`);
  }
}

export interface FileBytes {
  bytes: Buffer;
  sha256: string;
  size: number;
  /** More than `maxBytes`: `bytes` holds only the first `maxBytes`. */
  cut: boolean;
}

/** Reads a sandbox file, hashing all of it and keeping at most `maxBytes`. */
export async function readFileBytes(
  ctx: CallContext,
  sandbox: Sandbox,
  path: string,
  maxBytes: number,
): Promise<FileBytes> {
  const stream = await sandbox.files.read(path, { format: "stream", signal: ctx.extra.signal });
  const hash = createHash("sha256");
  const kept: Uint8Array[] = [];
  let keptBytes = 0;
  let size = 0;
  for await (const chunk of stream) {
    hash.update(chunk);
    size += chunk.length;
    if (keptBytes < maxBytes) {
      const part = chunk.subarray(0, maxBytes - keptBytes);
      kept.push(part);
      keptBytes += part.length;
    }
  }
  return { bytes: Buffer.concat(kept), sha256: hash.digest("hex"), size, cut: size > maxBytes };
}
