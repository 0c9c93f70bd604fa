/**
 * The agent tools (packages/tools) on this server: MCP over streamable HTTP at `/mcp`, the corpus
 * at `/corpus`, conversations and turns at `/conversations`. The tools reach sandboxes through
 * this server's own public API over loopback, as any client would, with a key of the caller's
 * tenant. Each tenant has its own tools state (`$BOTHY_HOME/tenants/<id>/tools/`; the default
 * tenant's is `$BOTHY_HOME/tools/`): conversations, turns, exports, the corpus and its index, and
 * MCP sessions, so another tenant's ids are unknown ids there.
 */
import { createReadStream } from "node:fs";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import type { FastifyInstance, FastifyRequest } from "fastify";
import type { Logger as PinoLogger } from "pino";
import { BothyError, beginTurnRequest, corpusUploadQuery, createConversationRequest } from "@bothy/protocol";
import { AgentTools, corpusMediaType, McpHttpSessions } from "@bothy/tools";
import { principalOf } from "../auth/auth-hooks.ts";
import type { KeyRing } from "../auth/key-ring.ts";
import type { Config } from "../config.ts";
import type { ApprovalBroker } from "../gateway/approvals.ts";
import type { GatewayPolicies } from "../gateway/policies.ts";
import { toolGate } from "../gateway/tool-gate.ts";
import { DEFAULT_TENANT } from "../ledger/ledger.ts";
import { parseInput } from "./parse-input.ts";
import { ANY_JSON, empty, MCP_ERRORS, media, rawBody } from "./route-schema.ts";

/** MCP messages carry whole files (computer_write_file), so /mcp takes more than the API's JSON limit. */
const MCP_BODY_LIMIT = 32 * 1024 * 1024;
const CORPUS_BODY_LIMIT = 64 * 1024 * 1024;

type Conv = { Params: { id: string } };
type Turn = { Params: { id: string; turn: string } };

const tags = ["agent tools"];
/** The MCP transport reads these itself; JSON Schema, so their descriptions reach the document. */
const MCP_HEADERS = {
  type: "object",
  properties: {
    "mcp-session-id": {
      type: "string",
      description: "The session, from the answer to initialize; every request but initialize needs it",
    },
    "mcp-protocol-version": { type: "string", description: "The MCP protocol version negotiated at initialize" },
  },
};
/** /mcp is one transport; each method's operation says what it does there. */
const MCP_DOCS = {
  GET: {
    tags,
    summary: "MCP streamable HTTP: the server-to-client stream (Accept: text/event-stream)",
    headers: MCP_HEADERS,
    response: { 200: media("text/event-stream", "An SSE stream of MCP messages"), default: MCP_ERRORS },
  },
  POST: {
    tags,
    summary:
      "MCP streamable HTTP: a JSON-RPC message (Accept: application/json, text/event-stream); without mcp-session-id it must be initialize",
    headers: MCP_HEADERS,
    body: rawBody("A JSON-RPC 2.0 message or batch (MCP)"),
    response: {
      200: media(["application/json", "text/event-stream"], "The JSON-RPC answer, as JSON or an SSE stream"),
      202: empty("Notifications or responses accepted; no body"),
      default: MCP_ERRORS,
    },
  },
  DELETE: {
    tags,
    summary: "MCP streamable HTTP: end the session",
    headers: MCP_HEADERS,
    response: { 200: empty("Session ended"), default: MCP_ERRORS },
  },
};
const corpusAddDoc = {
  tags,
  summary: "Add a document to the corpus (CSV, text, Markdown)",
  querystring: corpusUploadQuery,
  consumes: ["text/csv"],
  body: rawBody("The document's bytes (text/csv, text/plain or text/markdown)"),
  response: { 201: ANY_JSON },
};
const doc = (summary: string, response: Record<number, unknown> = { 200: ANY_JSON }): object => ({
  tags,
  summary,
  response,
});
const conversationDoc = {
  tags,
  summary: "Create a conversation (an id seen before answers 200)",
  body: createConversationRequest,
  response: { 201: ANY_JSON, 200: ANY_JSON },
};
const turnDoc = {
  tags,
  summary: "Begin a turn (ending the open one)",
  body: beginTurnRequest,
  response: { 201: ANY_JSON },
};

function loopbackUrl(app: FastifyInstance): string {
  const address = app.server.address() as AddressInfo | null;
  if (!address) throw new BothyError("shutting_down", "The server is not listening.");
  const host =
    address.address === "0.0.0.0"
      ? "127.0.0.1"
      : address.address === "::"
        ? "[::1]"
        : address.family === "IPv6"
          ? `[${address.address}]`
          : address.address;
  return `http://${host}:${address.port}`;
}

interface TenantTools {
  tools: AgentTools;
  sessions: McpHttpSessions;
}

export async function agentToolRoutes(
  app: FastifyInstance,
  config: Config,
  logger: PinoLogger,
  ring: KeyRing,
  gateway: { approvals: ApprovalBroker; policies: GatewayPolicies },
): Promise<void> {
  const opened = new Map<string, Promise<TenantTools>>();
  const open = async (tenant: string): Promise<TenantTools> => {
    const tools = await AgentTools.open({
      home: tenant === DEFAULT_TENANT ? config.home : join(config.home, "tenants", tenant),
      apiUrl: () => loopbackUrl(app),
      apiKey: ring.serviceKey(tenant),
      defaultTemplate: process.env["BOTHY_TOOLS_TEMPLATE"] ?? "workspace",
      log: (level, event, fields) => logger[level]({ event, tenant, ...fields }, event),
      gate: toolGate(tenant, {
        approvals: gateway.approvals,
        policyOf: (id) => gateway.policies.policyOf(id),
        tenantPolicy: (t) => gateway.policies.effective(t, {}),
      }),
    });
    return { tools, sessions: new McpHttpSessions(tools) };
  };
  const of = (request: FastifyRequest): Promise<TenantTools> => {
    const { tenant } = principalOf(request);
    let found = opened.get(tenant);
    if (!found) {
      found = open(tenant);
      opened.set(tenant, found);
      found.catch(() => opened.delete(tenant));
    }
    return found;
  };
  const toolsOf = async (request: FastifyRequest): Promise<AgentTools> => (await of(request)).tools;
  // The default tenant's state is opened at start, as before tenants, so a bad tools directory stops start-up.
  opened.set(DEFAULT_TENANT, open(DEFAULT_TENANT));
  await opened.get(DEFAULT_TENANT);
  app.addHook("onClose", async () => {
    for (const pending of opened.values()) {
      const t = await pending.catch(() => undefined);
      if (!t) continue;
      await t.sessions.close();
      t.tools.close();
    }
  });

  await app.register(async (scope) => {
    for (const [method, schema] of Object.entries(MCP_DOCS))
      scope.route({
        method,
        url: "/mcp",
        schema,
        bodyLimit: MCP_BODY_LIMIT,
        handler: async (request, reply) => {
          const { sessions } = await of(request);
          // The MCP transport hands this to the tools as the call's authInfo: who calls, never the key itself.
          const { keyId, scopes } = principalOf(request);
          Object.assign(request.raw, { auth: { token: "", clientId: keyId ?? "", scopes: [...scopes] } });
          reply.hijack();
          await sessions.handle(request.raw, reply.raw, request.body);
        },
      });

    // Documents are raw bytes; the route checks their type itself.
    scope.addContentTypeParser("*", { parseAs: "buffer", bodyLimit: CORPUS_BODY_LIMIT }, (_request, body, done) =>
      done(null, body),
    );
    scope.post<{ Querystring: Record<string, string> }>(
      "/corpus",
      { bodyLimit: CORPUS_BODY_LIMIT, schema: corpusAddDoc },
      async (request, reply) => {
        const tools = await toolsOf(request);
        const { name } = parseInput(corpusUploadQuery, request.query, "POST /corpus?name=<file name>");
        const type = corpusMediaType(request.headers["content-type"], name);
        if (!type)
          throw new BothyError(
            "unsupported_media_type",
            "The corpus takes CSV, plain text, Markdown and PDF: send Content-Type text/csv, text/plain, text/markdown or application/pdf (or a .csv/.txt/.md/.pdf name).",
          );
        if (!Buffer.isBuffer(request.body))
          throw new BothyError("invalid_request", "POST /corpus takes the document's bytes as the body.");
        const text = type === "application/pdf" ? await tools.pdfText(request.body) : undefined;
        return reply.code(201).send(await tools.corpus.add(name, type, request.body, text));
      },
    );
  });

  app.get("/corpus", { schema: doc("List corpus documents") }, async (request) => ({
    documents: (await toolsOf(request)).store.documents(),
  }));
  app.get<Conv>("/corpus/:id", { schema: doc("Show a corpus document") }, async (request) => {
    const doc = (await toolsOf(request)).store.document(request.params.id);
    if (!doc)
      throw new BothyError(
        "document_not_found",
        `No corpus document ${request.params.id.slice(0, 64)}; GET /corpus lists them.`,
      );
    return doc;
  });
  app.delete<Conv>("/corpus/:id", { schema: doc("Delete a corpus document") }, async (request) => {
    if (!(await toolsOf(request)).store.deleteDocument(request.params.id))
      throw new BothyError(
        "document_not_found",
        `No corpus document ${request.params.id.slice(0, 64)}; GET /corpus lists them.`,
      );
    return { document_id: request.params.id, deleted: true };
  });

  app.post("/conversations", { schema: conversationDoc }, async (request, reply) => {
    const tools = await toolsOf(request);
    const body = parseInput(createConversationRequest, request.body, "POST /conversations");
    if (body.sandbox_id !== undefined) await tools.checkSandbox(body.sandbox_id);
    const existed = body.conversation_id !== undefined && tools.store.conversation(body.conversation_id) !== undefined;
    return reply.code(existed ? 200 : 201).send(tools.createConversation(body));
  });
  app.get<Conv>("/conversations/:id", { schema: doc("Show a conversation and its turns") }, async (request) => {
    const tools = await toolsOf(request);
    return { ...tools.conversation(request.params.id), turns: tools.store.turns(request.params.id) };
  });
  app.delete<Conv>("/conversations/:id", { schema: doc("Delete a conversation and its sandbox") }, async (request) =>
    (await toolsOf(request)).deleteConversation(request.params.id),
  );
  app.post<Conv>("/conversations/:id/turns", { schema: turnDoc }, async (request, reply) => {
    const tools = await toolsOf(request);
    const { turn_id } = parseInput(beginTurnRequest, request.body, "POST /conversations/{id}/turns");
    return reply.code(201).send(tools.beginTurn(request.params.id, turn_id));
  });
  app.get<Turn>("/conversations/:id/turns/:turn", { schema: doc("Show a turn") }, async (request) =>
    (await toolsOf(request)).turnView(request.params.id, request.params.turn),
  );
  app.post<Turn>("/conversations/:id/turns/:turn/end", { schema: doc("End a turn") }, async (request) =>
    (await toolsOf(request)).endTurn(request.params.id, request.params.turn),
  );
  app.get<{ Params: { id: string; turn: string; export: string } }>(
    "/conversations/:id/turns/:turn/attachments/:export",
    {
      schema: doc("Download a file the turn exported", { 200: media("application/octet-stream", "The file's bytes") }),
    },
    async (request, reply) => {
      const tools = await toolsOf(request);
      const { id, turn, export: exportId } = request.params;
      const file = tools.attachment(id, turn, exportId);
      const name = file.name.replace(/[^\x20-\x7e]|["\\]/g, "_");
      return reply
        .type(file.media_type)
        .header("content-length", file.size)
        .header(
          "content-disposition",
          `attachment; filename="${name}"; filename*=UTF-8''${encodeURIComponent(file.name)}`,
        )
        .header("x-content-sha256", file.sha256)
        .send(createReadStream(tools.exportPath(file.export_id)));
    },
  );
}
