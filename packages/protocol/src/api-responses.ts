/**
 * Answers of the REST API that have no request twin: file results, listings, command lists and
 * the problem+json body. The server documents them in /openapi.json; the SDK checks them.
 */
import { z } from "zod";
import { bothyEvent, commandInfo } from "./api.ts";
import { ERROR_CODES } from "./errors.ts";
import { dirEntry, fileStat } from "./guest-frames.ts";

export const fileWriteResult = z.object({ path: z.string(), size: z.number().int(), sha256: z.string() });
export const fileStatResult = z.object({ ...fileStat.shape, path: z.string() });
export const dirListing = z.object({ path: z.string(), entries: z.array(dirEntry), truncated: z.boolean() });
export const fileDeleteResult = z.object({ path: z.string(), deleted: z.literal(true) });
export const mkdirResult = z.object({ path: z.string(), created: z.literal(true) });
export const renameResult = z.object({ from: z.string(), to: z.string(), renamed: z.literal(true) });
export const commandList = z.object({ commands: z.array(commandInfo) });
/** A listening TCP socket inside a sandbox: its port and the address it is bound to. */
export const listeningPort = z.object({ port: z.number().int().min(1).max(65535), address: z.string() });
export const portList = z.object({ ports: z.array(listeningPort) });
export type ListeningPort = z.infer<typeof listeningPort>;

/** RFC 9457 problem details with bothy's stable `code`; extra members may follow. */
export const problemDetails = z.looseObject({
  type: z.string(),
  title: z.string(),
  status: z.number().int(),
  code: z.enum(ERROR_CODES),
  detail: z.string(),
  instance: z.string().optional(),
});

/**
 * A JSON-RPC 2.0 error response. `/mcp` answers the errors its MCP transport finds this way
 * (the MCP contract), not as problem+json.
 */
export const jsonRpcErrorResponse = z.object({
  jsonrpc: z.literal("2.0"),
  error: z.object({ code: z.number().int(), message: z.string(), data: z.unknown().optional() }),
  id: z.union([z.string(), z.number(), z.null()]),
});

/** `GET /sandboxes/{id}/audit`: the gateway's events about one sandbox, oldest first. */
export const auditList = z.object({ events: z.array(bothyEvent) });
