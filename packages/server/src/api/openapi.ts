/**
 * The OpenAPI 3.1 document, generated from the protocol's zod schemas (`z.toJSONSchema`) and
 * the route table below; served at `GET /openapi.json`. Every route Fastify registers is
 * recorded, and `undocumentedRoutes` names any the table lacks (a test keeps them equal).
 */
import type { FastifyInstance } from "fastify";
import { requirementOf } from "../auth/scopes.ts";
import { z } from "zod";
import {
  apiKeyInfo,
  beginTurnRequest,
  createdKey,
  createKeyRequest,
  createTenantRequest,
  hostPolicyRequest,
  putSecretRequest,
  secretInfo,
  secretList,
  tenantPolicyInfo,
  keyList,
  tenantInfo,
  tenantList,
  tenantQuota,
  bothyEvent,
  commandEvent,
  commandInfo,
  commandInput,
  commandList,
  commandRequest,
  commandResult,
  commandSocketQuery,
  corpusUploadQuery,
  createConversationRequest,
  createSandboxRequest,
  desktopAction,
  desktopActionResult,
  desktopInfo,
  desktopStartRequest,
  linkRequest,
  linkResponse,
  dirListing,
  fileDeleteQuery,
  sandboxDeleteQuery,
  fileDeleteResult,
  fileQuery,
  fileStatQuery,
  fileStatResult,
  fileWriteQuery,
  fileWriteResult,
  healthz,
  jsonRpcErrorResponse,
  usageReport,
  mkdirRequest,
  mkdirResult,
  portList,
  problemDetails,
  renameRequest,
  renameResult,
  sandboxInfo,
  sandboxList,
  setTimeoutRequest,
  auditQuery,
  auditList,
  approvalInfo,
  approvalList,
  approvalListQuery,
  decideApprovalRequest,
  uiSessionInfo,
  uiSignInRequest,
} from "@bothy/protocol";

/** Named schemas, published under #/components/schemas. */
const SCHEMAS = {
  Problem: problemDetails,
  JsonRpcError: jsonRpcErrorResponse,
  CreateSandboxRequest: createSandboxRequest,
  SetTimeoutRequest: setTimeoutRequest,
  Sandbox: sandboxInfo,
  SandboxList: sandboxList,
  Healthz: healthz,
  Usage: usageReport,
  CommandRequest: commandRequest,
  CommandInput: commandInput,
  CommandEvent: commandEvent,
  Command: commandInfo,
  CommandList: commandList,
  CommandResult: commandResult,
  Event: bothyEvent,
  AuditList: auditList,
  FileWriteResult: fileWriteResult,
  FileStat: fileStatResult,
  DirListing: dirListing,
  FileDeleteResult: fileDeleteResult,
  MkdirRequest: mkdirRequest,
  MkdirResult: mkdirResult,
  RenameRequest: renameRequest,
  RenameResult: renameResult,
  PortList: portList,
  DesktopStartRequest: desktopStartRequest,
  LinkRequest: linkRequest,
  Link: linkResponse,
  Desktop: desktopInfo,
  DesktopAction: desktopAction,
  DesktopActionResult: desktopActionResult,
  CreateConversationRequest: createConversationRequest,
  BeginTurnRequest: beginTurnRequest,
  CreateKeyRequest: createKeyRequest,
  CreatedKey: createdKey,
  ApiKey: apiKeyInfo,
  KeyList: keyList,
  CreateTenantRequest: createTenantRequest,
  TenantQuota: tenantQuota,
  Tenant: tenantInfo,
  TenantList: tenantList,
  Approval: approvalInfo,
  ApprovalList: approvalList,
  DecideApprovalRequest: decideApprovalRequest,
  DenyApprovalRequest: decideApprovalRequest.pick({ reason: true }),
  HostPolicy: hostPolicyRequest,
  TenantPolicy: tenantPolicyInfo,
  PutSecretRequest: putSecretRequest,
  Secret: secretInfo,
  SecretList: secretList,
  UiSignInRequest: uiSignInRequest,
  UiSession: uiSessionInfo,
} satisfies Record<string, z.ZodType>;

type SchemaName = keyof typeof SCHEMAS;
type Method = "get" | "post" | "put" | "patch" | "delete" | "options";

interface Answer {
  description: string;
  /** A named schema, or the media types of a body that is not one. */
  schema?: SchemaName;
  type?: string | string[];
}

/** What an operation's error answers are: their media types and the schema of each. */
interface Errors {
  description: string;
  content: Partial<Record<string, SchemaName>>;
}

const PROBLEM_ERRORS: Errors = {
  description: "An error: RFC 9457 problem details with a stable code",
  content: { "application/problem+json": "Problem" },
};

/** /mcp speaks MCP's streamable HTTP transport, whose errors are JSON-RPC; only what fails before it is problem+json. */
const MCP_ERRORS: Errors = {
  description:
    "Errors the MCP transport finds (no or an unknown mcp-session-id, an Accept without application/json and text/event-stream, an unsupported mcp-protocol-version, a body that is not JSON-RPC) are JSON-RPC error responses with application/json, as MCP specifies. Errors found before it (a body over 32 MiB or not JSON, a bad URL) are problem+json with a stable code.",
  content: { "application/json": "JsonRpcError", "application/problem+json": "Problem" },
};

const MCP_SESSION = {
  name: "mcp-session-id",
  description: "The session, from the answer to initialize; every request but initialize needs it",
};
const MCP_VERSION = {
  name: "mcp-protocol-version",
  description: "The MCP protocol version negotiated at initialize",
};

interface Operation {
  method: Method;
  /** OpenAPI form: /sandboxes/{id}. */
  path: string;
  tag: string;
  summary: string;
  body?: SchemaName | { type: string; description: string };
  query?: z.ZodObject;
  answers: Record<number, Answer>;
  /** Request headers the operation reads. */
  headers?: Array<{ name: string; description: string }>;
  /** Its error answers; problem+json unless said otherwise. */
  errors?: Errors;
  /** For WebSocket routes: what the client sends and what the server streams. */
  websocket?: { send: SchemaName[]; receive: SchemaName };
}

const PROXY_PATHS = ["/sandboxes/{id}/ports/{port}", "/sandboxes/{id}/ports/{port}/*"];
const PROXY_METHODS: Method[] = ["get", "post", "put", "patch", "delete", "options"];

const SANDBOX: Answer = { description: "The sandbox", schema: "Sandbox" };
const BYTES = "application/octet-stream";
const ANY_JSON: Answer = { description: "A JSON object (see the README)", type: "application/json" };

/** Every route the server serves. A route added without a row here fails openapi.test.ts. */
export const OPERATIONS: Operation[] = [
  {
    method: "post",
    path: "/sandboxes",
    tag: "sandboxes",
    summary: "Create a sandbox (Idempotency-Key header: replay answers 200 and the same sandbox)",
    body: "CreateSandboxRequest",
    answers: {
      201: SANDBOX,
      200: { description: "Replayed Idempotency-Key: the sandbox made before", schema: "Sandbox" },
    },
  },
  {
    method: "get",
    path: "/sandboxes",
    tag: "sandboxes",
    summary: "List live sandboxes",
    answers: { 200: { description: "Live sandboxes", schema: "SandboxList" } },
  },
  {
    method: "get",
    path: "/sandboxes/{id}",
    tag: "sandboxes",
    summary: "Show a sandbox (also once deleted)",
    answers: { 200: SANDBOX },
  },
  {
    method: "delete",
    path: "/sandboxes/{id}",
    tag: "sandboxes",
    summary: "Delete a sandbox (idempotent): answers once it is deleting, or with wait=true once deleted",
    query: sandboxDeleteQuery,
    answers: { 200: SANDBOX },
  },
  {
    method: "post",
    path: "/sandboxes/{id}/pause",
    tag: "sandboxes",
    summary: "Pause: memory to disk, VM ended (QEMU)",
    answers: { 200: SANDBOX },
  },
  {
    method: "post",
    path: "/sandboxes/{id}/resume",
    tag: "sandboxes",
    summary: "Resume a paused sandbox",
    answers: { 200: SANDBOX },
  },
  {
    method: "post",
    path: "/sandboxes/{id}/timeout",
    tag: "sandboxes",
    summary: "Expire the sandbox timeout_s seconds from now",
    body: "SetTimeoutRequest",
    answers: { 200: SANDBOX },
  },
  {
    method: "get",
    path: "/sandboxes/{id}/command",
    tag: "commands",
    summary:
      "WebSocket: run one command (first message CommandRequest, then CommandInput; the server streams CommandEvent, process_exited or error last); with keep=true the socket stays open after each command and the next CommandRequest starts the next, one at a time",
    query: commandSocketQuery,
    answers: { 101: { description: "Switching to the WebSocket" } },
    websocket: { send: ["CommandRequest", "CommandInput"], receive: "CommandEvent" },
  },
  {
    method: "get",
    path: "/sandboxes/{id}/commands",
    tag: "commands",
    summary: "List the sandbox's commands",
    answers: { 200: { description: "Commands", schema: "CommandList" } },
  },
  {
    method: "post",
    path: "/sandboxes/{id}/commands",
    tag: "commands",
    summary:
      "Run one command to its end in one request (no stdin, pty or background: those need the WebSocket); output past 16 MiB a stream is dropped with truncated: true; a client that leaves kills it",
    body: "CommandRequest",
    answers: { 200: { description: "How it ended, with its output", schema: "CommandResult" } },
  },
  {
    method: "get",
    path: "/sandboxes/{id}/commands/{commandId}",
    tag: "commands",
    summary: "Show a command; as a WebSocket, re-attach to its output (replay, then live)",
    answers: {
      200: { description: "The command", schema: "Command" },
      101: { description: "Re-attached over WebSocket" },
    },
    websocket: { send: ["CommandInput"], receive: "CommandEvent" },
  },
  {
    method: "get",
    path: "/sandboxes/{id}/files",
    tag: "files",
    summary: "Read a file",
    query: fileQuery,
    answers: { 200: { description: "The file's bytes", type: BYTES } },
  },
  {
    method: "put",
    path: "/sandboxes/{id}/files",
    tag: "files",
    summary: 'Replace a file atomically (If-Match: "<sha256>" guards against concurrent changes)',
    query: fileWriteQuery,
    body: { type: BYTES, description: "The file's bytes" },
    answers: { 200: { description: "Written", schema: "FileWriteResult" } },
  },
  {
    method: "delete",
    path: "/sandboxes/{id}/files",
    tag: "files",
    summary: "Remove a file or directory",
    query: fileDeleteQuery,
    answers: { 200: { description: "Removed", schema: "FileDeleteResult" } },
  },
  {
    method: "get",
    path: "/sandboxes/{id}/files/stat",
    tag: "files",
    summary: "Stat a path",
    query: fileStatQuery,
    answers: { 200: { description: "Its metadata", schema: "FileStat" } },
  },
  {
    method: "get",
    path: "/sandboxes/{id}/files/list",
    tag: "files",
    summary: "List a directory (at most 5000 entries)",
    query: fileQuery,
    answers: { 200: { description: "Entries", schema: "DirListing" } },
  },
  {
    method: "post",
    path: "/sandboxes/{id}/files/mkdir",
    tag: "files",
    summary: "Make a directory",
    body: "MkdirRequest",
    answers: { 200: { description: "Made", schema: "MkdirResult" } },
  },
  {
    method: "post",
    path: "/sandboxes/{id}/files/rename",
    tag: "files",
    summary: "Rename a path",
    body: "RenameRequest",
    answers: { 200: { description: "Renamed", schema: "RenameResult" } },
  },
  {
    method: "get",
    path: "/sandboxes/{id}/ports",
    tag: "ports",
    summary: "List the TCP ports listening inside the sandbox",
    answers: { 200: { description: "Listening sockets", schema: "PortList" } },
  },
  {
    method: "post",
    path: "/sandboxes/{id}/port-links/{port}",
    tag: "ports",
    summary:
      "A signed link that opens the port in a browser without an API key until it expires (ttl_s, default 3600, max 86400): its first GET moves the token into an HttpOnly cookie for that port",
    body: "LinkRequest",
    answers: { 200: { description: "The link (and its preview host form with BOTHY_PREVIEW_DOMAIN)", schema: "Link" } },
  },
  ...PROXY_PATHS.flatMap((path) =>
    PROXY_METHODS.map((method): Operation => ({
      method,
      path,
      tag: "ports",
      summary:
        "Proxied to 127.0.0.1:{port} inside the sandbox (HTTP and WebSocket upgrades; 502 port_not_listening when nothing listens). Answers on the API's origin carry a CSP sandbox without allow-same-origin; a request let in by a link's cookie whose Origin is another origin gets 403 origin_refused",
      answers: { 200: { description: "Whatever the server inside answers", type: "*/*" } },
    })),
  ),
  {
    method: "get",
    path: "/sandboxes/{id}/tunnel/{port}",
    tag: "ports",
    summary:
      "WebSocket: a raw TCP connection to 127.0.0.1:{port} inside the sandbox, its bytes in binary messages (what `bothy port --forward` uses)",
    answers: { 101: { description: "Switching to WebSocket" } },
  },
  {
    method: "post",
    path: "/sandboxes/{id}/desktop/start",
    tag: "desktop",
    summary:
      "Start the desktop (Xvfb, openbox, x11vnc, Chromium) if it is not running; template desktop (409 desktop_not_available otherwise)",
    body: "DesktopStartRequest",
    answers: { 200: { description: "The running desktop", schema: "Desktop" } },
  },
  {
    method: "get",
    path: "/sandboxes/{id}/desktop/screenshot",
    tag: "desktop",
    summary: "The screen as a PNG (X-Screen-Width/Height); coordinates of actions are its pixels. Starts the desktop",
    answers: { 200: { description: "The screen", type: "image/png" } },
  },
  {
    method: "post",
    path: "/sandboxes/{id}/desktop/actions",
    tag: "desktop",
    summary: "Mouse and keyboard: move, click, type, key, scroll (xdotool inside the sandbox). Starts the desktop",
    body: "DesktopAction",
    answers: { 200: { description: "Done", schema: "DesktopActionResult" } },
  },
  {
    method: "get",
    path: "/sandboxes/{id}/desktop",
    tag: "desktop",
    summary:
      "The live view: a noVNC page (view only; ?control=1 passes mouse and keyboard on with sandboxes:write); ?token= from a desktop link instead of an API key",
    query: z.object({ control: z.enum(["1"]).optional(), token: z.string().optional() }),
    answers: { 200: { description: "An HTML page", type: "text/html" } },
  },
  {
    method: "post",
    path: "/sandboxes/{id}/desktop/link",
    tag: "desktop",
    summary:
      "A signed link to the live view that opens without an API key until it expires (ttl_s, default 3600, max 86400); view only unless control (which needs sandboxes:write)",
    body: "LinkRequest",
    answers: { 200: { description: "The link", schema: "Link" } },
  },
  {
    method: "get",
    path: "/sandboxes/{id}/desktop/vnc",
    tag: "desktop",
    summary:
      "WebSocket: the desktop's VNC (RFB) stream in binary messages, relayed to x11vnc inside (what noVNC connects to); input is dropped without sandboxes:write; ?token= from a desktop link instead of an API key",
    answers: { 101: { description: "Switching to WebSocket" } },
  },
  {
    method: "get",
    path: "/sandboxes/{id}/desktop/cdp/*",
    tag: "desktop",
    summary:
      "Chromium's DevTools /json/version and /json/list, WebSocket URLs rewritten to the port proxy: give /sandboxes/{id}/desktop/cdp to Playwright's connectOverCDP",
    answers: { 200: { description: "DevTools JSON", type: "application/json" } },
  },
  {
    method: "get",
    path: "/desktop/novnc/*",
    tag: "desktop",
    summary: "noVNC's own files (core/, vendor/), for the live view",
    answers: { 200: { description: "JavaScript", type: "text/javascript" } },
  },
  {
    method: "get",
    path: "/events",
    tag: "events",
    summary: "Server-Sent Events (?sandbox_id= filters; Last-Event-ID or ?since= replays)",
    query: z.object({ sandbox_id: z.string().optional(), since: z.string().regex(/^\d+$/).optional() }),
    answers: { 200: { description: "An SSE stream; each data line is an Event", type: "text/event-stream" } },
  },
  {
    method: "get",
    path: "/sandboxes/{id}/audit",
    tag: "events",
    summary:
      "The egress gateway's decisions about this sandbox from the ledger, oldest first (?type=egress.denied, comma-separated; ?after=SEQ pages on; ?limit=)",
    query: auditQuery,
    answers: { 200: { description: "Events", schema: "AuditList" } },
  },
  {
    method: "get",
    path: "/healthz",
    tag: "server",
    summary: "Liveness and sandbox counts",
    answers: { 200: { description: "Healthy", schema: "Healthz" } },
  },
  {
    method: "get",
    path: "/usage",
    tag: "server",
    summary:
      "Metered vCPU and memory hours this month, per owner, with the budgets (?sandbox_id= adds one sandbox's lifetime figures)",
    query: z.object({ sandbox_id: z.string().optional() }),
    answers: { 200: { description: "Usage", schema: "Usage" } },
  },
  {
    method: "get",
    path: "/metrics",
    tag: "server",
    summary: "Prometheus metrics",
    answers: { 200: { description: "Prometheus text format", type: "text/plain" } },
  },
  {
    method: "get",
    path: "/openapi.json",
    tag: "server",
    summary: "This document",
    answers: { 200: { description: "OpenAPI 3.1", type: "application/json" } },
  },
  {
    method: "get",
    path: "/mcp",
    tag: "agent tools",
    summary: "MCP streamable HTTP: the server-to-client stream (Accept: text/event-stream)",
    headers: [MCP_SESSION, MCP_VERSION],
    answers: { 200: { description: "An SSE stream of MCP messages", type: "text/event-stream" } },
    errors: MCP_ERRORS,
  },
  {
    method: "post",
    path: "/mcp",
    tag: "agent tools",
    summary:
      "MCP streamable HTTP: a JSON-RPC message (Accept: application/json, text/event-stream); without mcp-session-id it must be initialize",
    headers: [MCP_SESSION, MCP_VERSION],
    body: { type: "application/json", description: "A JSON-RPC 2.0 message or batch (MCP)" },
    answers: {
      200: {
        description: "The JSON-RPC answer, as JSON or an SSE stream",
        type: ["application/json", "text/event-stream"],
      },
      202: { description: "Notifications or responses accepted; no body" },
    },
    errors: MCP_ERRORS,
  },
  {
    method: "delete",
    path: "/mcp",
    tag: "agent tools",
    summary: "MCP streamable HTTP: end the session",
    headers: [MCP_SESSION, MCP_VERSION],
    answers: { 200: { description: "Session ended" } },
    errors: MCP_ERRORS,
  },
  {
    method: "post",
    path: "/corpus",
    tag: "agent tools",
    summary: "Add a document to the corpus (CSV, text, Markdown)",
    query: corpusUploadQuery,
    body: { type: "text/csv", description: "The document's bytes (text/csv, text/plain or text/markdown)" },
    answers: { 201: ANY_JSON },
  },
  { method: "get", path: "/corpus", tag: "agent tools", summary: "List corpus documents", answers: { 200: ANY_JSON } },
  {
    method: "get",
    path: "/corpus/{id}",
    tag: "agent tools",
    summary: "Show a corpus document",
    answers: { 200: ANY_JSON },
  },
  {
    method: "delete",
    path: "/corpus/{id}",
    tag: "agent tools",
    summary: "Delete a corpus document",
    answers: { 200: ANY_JSON },
  },
  {
    method: "post",
    path: "/conversations",
    tag: "agent tools",
    summary: "Create a conversation (an id seen before answers 200)",
    body: "CreateConversationRequest",
    answers: { 201: ANY_JSON, 200: ANY_JSON },
  },
  {
    method: "get",
    path: "/conversations/{id}",
    tag: "agent tools",
    summary: "Show a conversation and its turns",
    answers: { 200: ANY_JSON },
  },
  {
    method: "delete",
    path: "/conversations/{id}",
    tag: "agent tools",
    summary: "Delete a conversation and its sandbox",
    answers: { 200: ANY_JSON },
  },
  {
    method: "post",
    path: "/conversations/{id}/turns",
    tag: "agent tools",
    summary: "Begin a turn (ending the open one)",
    body: "BeginTurnRequest",
    answers: { 201: ANY_JSON },
  },
  {
    method: "get",
    path: "/conversations/{id}/turns/{turn}",
    tag: "agent tools",
    summary: "Show a turn",
    answers: { 200: ANY_JSON },
  },
  {
    method: "post",
    path: "/conversations/{id}/turns/{turn}/end",
    tag: "agent tools",
    summary: "End a turn",
    answers: { 200: ANY_JSON },
  },
  {
    method: "get",
    path: "/conversations/{id}/turns/{turn}/attachments/{export}",
    tag: "agent tools",
    summary: "Download a file the turn exported",
    answers: { 200: { description: "The file's bytes", type: BYTES } },
  },
  {
    method: "post",
    path: "/keys",
    tag: "keys",
    summary:
      "Make an API key (scope keys:manage); its scopes must be within the calling key's, and it expires no later than the calling key. The answer is the only time the key is shown",
    body: "CreateKeyRequest",
    answers: { 201: { description: "The key, with `key` itself", schema: "CreatedKey" } },
  },
  {
    method: "get",
    path: "/keys",
    tag: "keys",
    summary: "The tenant's API keys (every tenant's for an admin key), without the keys themselves",
    answers: { 200: { description: "Keys", schema: "KeyList" } },
  },
  {
    method: "delete",
    path: "/keys/{id}",
    tag: "keys",
    summary:
      "Revoke a key: refused from the next request on; its open WebSockets and event streams end, and so do the links and E2B access tokens it made",
    answers: { 200: { description: "The revoked key", schema: "ApiKey" } },
  },
  {
    method: "post",
    path: "/tenants",
    tag: "tenants",
    summary: "Make a tenant, with its quotas (scope admin)",
    body: "CreateTenantRequest",
    answers: { 201: { description: "The tenant", schema: "Tenant" } },
  },
  {
    method: "get",
    path: "/tenants",
    tag: "tenants",
    summary: "Every tenant, its quotas and what it uses now (scope admin)",
    answers: { 200: { description: "Tenants", schema: "TenantList" } },
  },
  {
    method: "get",
    path: "/tenants/{id}",
    tag: "tenants",
    summary: "A tenant, its quotas and what it uses now (scope admin)",
    answers: { 200: { description: "The tenant", schema: "Tenant" } },
  },
  {
    method: "patch",
    path: "/tenants/{id}/quota",
    tag: "tenants",
    summary: "Change a tenant's quotas: those named are set, null lifts one (scope admin)",
    body: "TenantQuota",
    answers: { 200: { description: "The tenant", schema: "Tenant" } },
  },
  {
    method: "get",
    path: "/approvals",
    tag: "approvals",
    summary:
      "Approvals an `ask` rule made, newest first: the tenant's (every tenant's for an admin key); filter by state and sandbox (scope approvals:decide)",
    query: approvalListQuery,
    answers: { 200: { description: "Approvals", schema: "ApprovalList" } },
  },
  {
    method: "get",
    path: "/approvals/{id}",
    tag: "approvals",
    summary: "One approval (scope approvals:decide)",
    answers: { 200: { description: "The approval", schema: "Approval" } },
  },
  {
    method: "post",
    path: "/approvals/{id}/approve",
    tag: "approvals",
    summary:
      "Approve a pending approval: the held request goes out once (grant `host` with `minutes`: the sandbox's requests to that host pass that long). A decided one answers 409 approval_not_pending",
    body: "DecideApprovalRequest",
    answers: { 200: { description: "The approval, approved", schema: "Approval" } },
  },
  {
    method: "post",
    path: "/approvals/{id}/deny",
    tag: "approvals",
    summary:
      "Deny a pending approval: the held request is refused (403) or the tool call fails. A decided one answers 409 approval_not_pending",
    body: "DenyApprovalRequest",
    answers: { 200: { description: "The approval, denied", schema: "Approval" } },
  },
  {
    method: "post",
    path: "/ui/session",
    tag: "dashboard",
    summary:
      "Sign in to the dashboard with an API key in the body: sets an HttpOnly, SameSite=Strict session cookie acting as that key, and returns the CSRF token its state-changing requests send as X-CSRF-Token",
    body: "UiSignInRequest",
    answers: { 201: { description: "The session", schema: "UiSession" } },
  },
  {
    method: "get",
    path: "/ui/session",
    tag: "dashboard",
    summary: "The caller's tenant and scopes, and with the session cookie its CSRF token",
    answers: { 200: { description: "The session", schema: "UiSession" } },
  },
  {
    method: "delete",
    path: "/ui/session",
    tag: "dashboard",
    summary: "Sign out: the session ends and its cookie is cleared",
    answers: { 204: { description: "Signed out" } },
  },
  {
    method: "get",
    path: "/ui",
    tag: "dashboard",
    summary: "Redirects to /ui/",
    answers: { 308: { description: "To /ui/" } },
  },
  {
    method: "get",
    path: "/ui/",
    tag: "dashboard",
    summary: "The dashboard (404 ui_not_built when `npm run build` has not built it)",
    answers: { 200: { description: "HTML", type: "text/html" } },
  },
  {
    method: "get",
    path: "/ui/assets/{name}",
    tag: "dashboard",
    summary: "The dashboard's hashed files, cached for a year",
    answers: { 200: { description: "JavaScript, CSS or images", type: ["text/javascript", "text/css"] } },
  },
  {
    method: "get",
    path: "/policy",
    tag: "policy",
    summary:
      "The tenant's default host policy, applied before every one of its sandboxes' own rules (`?tenant=` for an admin key)",
    answers: { 200: { description: "The policy", schema: "TenantPolicy" } },
  },
  {
    method: "put",
    path: "/policy",
    tag: "policy",
    summary: "Set the tenant's default host policy (scope policy); its sandboxes' next requests are judged by it",
    body: "HostPolicy",
    answers: { 200: { description: "The policy", schema: "TenantPolicy" } },
  },
  {
    method: "delete",
    path: "/policy",
    tag: "policy",
    summary: "Remove the tenant's default host policy (scope policy)",
    answers: { 200: { description: "The policy, now null", schema: "TenantPolicy" } },
  },
  {
    method: "put",
    path: "/secrets/{name}",
    tag: "secrets",
    summary:
      "Store a secret in the tenant's vault (scope secrets; `?tenant=` for an admin key), sealed; only the gateway opens it, for the hosts named. No answer ever shows the value",
    body: "PutSecretRequest",
    answers: {
      201: { description: "The secret was new (without its value)", schema: "Secret" },
      200: { description: "The secret was replaced (without its value)", schema: "Secret" },
    },
  },
  {
    method: "get",
    path: "/secrets",
    tag: "secrets",
    summary: "The tenant's secrets (every tenant's for an admin key), without their values",
    answers: { 200: { description: "Secrets", schema: "SecretList" } },
  },
  {
    method: "get",
    path: "/secrets/{name}",
    tag: "secrets",
    summary: "A secret's hosts and inject rule, without its value",
    answers: { 200: { description: "The secret", schema: "Secret" } },
  },
  {
    method: "delete",
    path: "/secrets/{name}",
    tag: "secrets",
    summary: "Remove a secret; sandboxes bound to it keep their placeholder, which the gateway then sends nowhere",
    answers: { 200: { description: "The removed secret", schema: "Secret" } },
  },
];

type Json = Record<string, unknown>;

function jsonSchema(schema: z.ZodType, io: "input" | "output"): Json {
  // Requests are documented as clients write them (defaults optional), answers as sent.
  const out = z.toJSONSchema(schema, { io, unrepresentable: "any" }) as Json;
  delete out["$schema"];
  return out;
}

/** The scope an operation needs (`public`: none; `key`: any valid key). */
function scopeOf(op: Operation): string {
  return requirementOf(op.method.toUpperCase(), op.path.replace(/\{(\w+)\}/g, ":$1"), op.websocket !== undefined);
}

const ref = (name: SchemaName): Json => ({ $ref: `#/components/schemas/${name}` });

function operation(op: Operation): Json {
  const params: Json[] = [...op.path.matchAll(/\{(\w+)\}/g)].map((m) => ({
    name: m[1],
    in: "path",
    required: true,
    schema: { type: "string" },
  }));
  for (const h of op.headers ?? [])
    params.push({
      name: h.name,
      in: "header",
      required: false,
      description: h.description,
      schema: { type: "string" },
    });
  if (op.query) {
    const q = jsonSchema(op.query, "input") as { properties?: Record<string, Json>; required?: string[] };
    for (const [name, schema] of Object.entries(q.properties ?? {}))
      params.push({ name, in: "query", required: q.required?.includes(name) ?? false, schema });
  }
  const responses: Json = {};
  for (const [status, a] of Object.entries(op.answers)) {
    responses[status] = {
      description: a.description,
      ...(a.schema
        ? { content: { "application/json": { schema: ref(a.schema) } } }
        : a.type
          ? { content: Object.fromEntries([a.type].flat().map((t) => [t, {}])) }
          : {}),
    };
  }
  const errors = op.errors ?? PROBLEM_ERRORS;
  responses["default"] = {
    description: errors.description,
    content: Object.fromEntries(
      Object.entries(errors.content).map(([type, name]) => [type, { schema: ref(name as SchemaName) }]),
    ),
  };
  let requestBody: Json | undefined;
  if (typeof op.body === "string")
    requestBody = { required: true, content: { "application/json": { schema: ref(op.body) } } };
  else if (op.body) requestBody = { required: true, description: op.body.description, content: { [op.body.type]: {} } };
  return {
    operationId: `${op.method}${op.path.replace(/\{(\w+)\}/g, "By_$1").replace(/[^A-Za-z0-9]+(.)?/g, (_m, c: string | undefined) => (c ?? "").toUpperCase())}`,
    tags: [op.tag],
    summary: op.summary,
    ...(params.length ? { parameters: params } : {}),
    ...(requestBody ? { requestBody } : {}),
    ...(scopeOf(op) === "public" ? { security: [] } : {}),
    "x-scope": scopeOf(op),
    responses,
    ...(op.websocket
      ? { "x-websocket": { send: op.websocket.send.map(ref), receive: ref(op.websocket.receive) } }
      : {}),
  };
}

export function openApiDocument(): Json {
  const paths: Record<string, Json> = {};
  for (const op of OPERATIONS) (paths[op.path] ??= {})[op.method] = operation(op);
  const requestSchemas = new Set<SchemaName>([
    "CreateSandboxRequest",
    "SetTimeoutRequest",
    "CommandRequest",
    "CommandInput",
    "MkdirRequest",
    "RenameRequest",
    "CreateConversationRequest",
    "BeginTurnRequest",
    "CreateKeyRequest",
    "CreateTenantRequest",
    "TenantQuota",
    "DecideApprovalRequest",
    "DenyApprovalRequest",
    "HostPolicy",
    "PutSecretRequest",
  ]);
  const schemas = Object.fromEntries(
    Object.entries(SCHEMAS).map(([name, s]) => [
      name,
      jsonSchema(s, requestSchemas.has(name as SchemaName) ? "input" : "output"),
    ]),
  );
  return {
    openapi: "3.1.0",
    info: {
      title: "bothy",
      version: "0.1.0",
      description:
        "Self-hosted sandboxes: create them, run commands over WebSockets, move files. Every operation but /healthz and /openapi.json takes an API key (Authorization: Bearer or X-API-Key); `x-scope` names the scope it needs. Errors are application/problem+json with a stable `code`; only /mcp answers the errors of its MCP transport as JSON-RPC, as MCP specifies (see its operations).",
    },
    paths,
    security: [{ bearer: [] }, { apiKey: [] }],
    components: {
      schemas,
      securitySchemes: {
        bearer: { type: "http", scheme: "bearer", description: "A bothy API key: bothy_ and 64 hex digits" },
        apiKey: { type: "apiKey", in: "header", name: "X-API-Key" },
      },
    },
  };
}

export interface RouteRecord {
  method: string;
  /** Fastify form: /sandboxes/:id */
  url: string;
  /** It takes a WebSocket upgrade. */
  websocket: boolean;
}

/** Records every route registered from now on (HEAD routes Fastify adds itself are left out). */
export function recordRoutes(app: FastifyInstance): RouteRecord[] {
  const routes: RouteRecord[] = [];
  app.addHook("onRoute", (route) => {
    // A route relaying upgrades itself (the port proxy) says so in its config.
    const relays = (route.config as { relaysUpgrade?: boolean } | undefined)?.relaysUpgrade === true;
    const websocket = Boolean(route.websocket ?? route.wsHandler) || relays;
    for (const method of [route.method].flat())
      if (method !== "HEAD") routes.push({ method: method.toLowerCase(), url: route.url, websocket });
  });
  return routes;
}

/**
 * The E2B-compatible surface follows E2B's own API (docs/architecture.md), not this document: its
 * prefix, and `/files` at the root for the e2b SDK's signed URLs.
 */
const E2B_PREFIX = "/e2b";
const E2B_ROOT_ROUTES = new Set(["/files"]);

/** `METHOD /path` of each recorded route that has no operation in the document. */
export function undocumentedRoutes(routes: readonly RouteRecord[], doc: Json = openApiDocument()): string[] {
  const paths = doc["paths"] as Record<string, Record<string, unknown>>;
  return routes
    .filter((r) => r.url !== E2B_PREFIX && !r.url.startsWith(`${E2B_PREFIX}/`) && !E2B_ROOT_ROUTES.has(r.url))
    .map((r) => ({ method: r.method, path: r.url.replace(/:(\w+)/g, "{$1}") }))
    .filter((r) => paths[r.path]?.[r.method] === undefined)
    .map((r) => `${r.method.toUpperCase()} ${r.path}`);
}

export function openapiRoutes(app: FastifyInstance): void {
  const doc = openApiDocument();
  app.get("/openapi.json", async () => doc);
}
