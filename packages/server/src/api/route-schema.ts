/**
 * Helpers for the `schema` of a route: the zod schemas of its answers in the form @fastify/swagger
 * and the zod type provider document (`api/openapi.ts`). Only documentation: requests are parsed
 * by the routes themselves (`parse-input.ts`), answers serialized as they are.
 */
import { z } from "zod";
import { jsonRpcErrorResponse, problemDetails } from "@bothy/protocol";

type Content = Record<string, { schema: z.ZodType }>;
export interface Answer {
  description: string;
  content: Content;
}

/** A JSON answer of this schema (a named one becomes a `$ref`). */
export const json = (schema: z.ZodType, description: string): Answer => ({
  description,
  content: { "application/json": { schema } },
});

/** An answer whose body is not JSON described by a schema: bytes, a page, a stream. */
export const media = (types: string | string[], description: string): Answer => ({
  description,
  content: Object.fromEntries([types].flat().map((t) => [t, { schema: z.any() }])),
});

/** An answer without a body (a WebSocket's 101, a 202), as JSON Schema: swagger documents no content for it. */
export const empty = (description: string): { type: "null"; description: string } => ({ type: "null", description });

/** Any JSON object (answers whose shape the README gives). */
export const ANY_JSON = media("application/json", "A JSON object (see the README)");

/** What a route's WebSocket takes and streams, as named component schemas. */
export interface WebSocketDoc {
  send: z.ZodType[];
  receive: z.ZodType;
}

export const PROBLEM_ERRORS: Answer = {
  description: "An error: RFC 9457 problem details with a stable code",
  content: { "application/problem+json": { schema: problemDetails } },
};

/** /mcp speaks MCP's streamable HTTP transport, whose errors are JSON-RPC; only what fails before it is problem+json. */
export const MCP_ERRORS: Answer = {
  description:
    "Errors the MCP transport finds (no or an unknown mcp-session-id, an Accept without application/json and text/event-stream, an unsupported mcp-protocol-version, a body that is not JSON-RPC) are JSON-RPC error responses with application/json, as MCP specifies. Errors found before it (a body over 32 MiB or not JSON, a bad URL) are problem+json with a stable code.",
  content: {
    "application/json": { schema: jsonRpcErrorResponse },
    "application/problem+json": { schema: problemDetails },
  },
};

/** A request body that is not JSON of a schema (bytes, a document), as JSON Schema. */
export const rawBody = (description: string): { description: string } => ({ description });
