import type { FastifyInstance, FastifyRequest } from "fastify";
import type { Readable } from "node:stream";
import {
  BothyError,
  dirListing,
  fileDeleteQuery,
  fileDeleteResult,
  fileStatResult,
  fileWriteResult,
  mkdirResult,
  renameResult,
  fileQuery,
  fileStatQuery,
  fileWriteQuery,
  mkdirRequest,
  renameRequest,
} from "@bothy/protocol";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import { parseInput } from "./parse-input.ts";
import { SANDBOX_FILE_HEADERS } from "./download-headers.ts";
import { json, media, rawBody } from "./route-schema.ts";

const tags = ["files"];
const BYTES = "application/octet-stream";
const readDoc = {
  tags,
  summary: "Read a file",
  querystring: fileQuery,
  response: { 200: media(BYTES, "The file's bytes") },
};
const writeDoc = {
  tags,
  summary: 'Replace a file atomically (If-Match: "<sha256>" guards against concurrent changes)',
  querystring: fileWriteQuery,
  consumes: [BYTES],
  body: rawBody("The file's bytes"),
  response: { 200: json(fileWriteResult, "Written") },
};
const removeDoc = {
  tags,
  summary: "Remove a file or directory",
  querystring: fileDeleteQuery,
  response: { 200: json(fileDeleteResult, "Removed") },
};
const statDoc = {
  tags,
  summary: "Stat a path",
  querystring: fileStatQuery,
  response: { 200: json(fileStatResult, "Its metadata") },
};
const listDoc = {
  tags,
  summary: "List a directory (at most 5000 entries)",
  querystring: fileQuery,
  response: { 200: json(dirListing, "Entries") },
};
const mkdirDoc = {
  tags,
  summary: "Make a directory",
  body: mkdirRequest,
  response: { 200: json(mkdirResult, "Made") },
};
const renameDoc = {
  tags,
  summary: "Rename a path",
  body: renameRequest,
  response: { 200: json(renameResult, "Renamed") },
};

type Params = { Params: { id: string } };

/** `If-Match: "<sha256>"` (quotes optional) guards a write against a file changed since read. */
function ifMatch(request: FastifyRequest): string | undefined {
  const raw = request.headers["if-match"];
  if (raw === undefined) return undefined;
  const value = (Array.isArray(raw) ? raw[0] : raw)?.trim().replace(/^W\//, "").replace(/^"|"$/g, "") ?? "";
  if (!/^[0-9a-f]{64}$/.test(value))
    throw new BothyError(
      "invalid_request",
      "If-Match takes the file's sha256 (64 hex digits), as GET /files/stat?sha256=true reports it.",
    );
  return value;
}

/**
 * The files API. Every path is resolved by the guest agent inside the sandbox (relative paths
 * from /workspace); the server never opens a path on the host for it. Reads and writes stream
 * under the guest protocol's credit windows, so large files pass without being buffered.
 */
export async function fileRoutes(app: FastifyInstance, manager: SandboxManager): Promise<void> {
  await app.register(async (scope) => {
    // Uploads are raw bytes of any type; the route streams the request body itself.
    scope.addContentTypeParser("*", (_request, payload, done) => done(null, payload));

    scope.get<Params & { Querystring: Record<string, string> }>(
      "/sandboxes/:id/files",
      { schema: readDoc },
      async (request, reply) => {
        const { path } = parseInput(fileQuery, request.query, "GET /files?path=<file>");
        // The length is that of the file the guest opened, so a symlink's target is sent whole.
        const { stat, stream } = await (await manager.agent(request.params.id)).openRead(path).catch((err: unknown) => {
          if (err instanceof BothyError && err.details?.["guest_code"] === "not_a_file")
            throw new BothyError(
              "file_error",
              `${err.message}: only regular files can be read; list a directory with GET /sandboxes/${request.params.id}/files/list?path=...`,
              { cause: err },
            );
          throw err;
        });
        return reply
          .type("application/octet-stream")
          .headers(SANDBOX_FILE_HEADERS)
          .header("content-length", stat.size)
          .send(stream);
      },
    );

    scope.put<Params & { Querystring: Record<string, string> }>(
      "/sandboxes/:id/files",
      { schema: writeDoc },
      async (request) => {
        const { path, mode } = parseInput(fileWriteQuery, request.query, "PUT /files?path=<file>");
        const expected = ifMatch(request);
        const body = (request.body as Readable | undefined) ?? [];
        const agent = await manager.agent(request.params.id);
        const written = await agent.writeStream(path, body, {
          mode: mode === undefined ? undefined : parseInt(mode, 8),
          ifSha256: expected,
        });
        return { path, ...written };
      },
    );

    scope.delete<Params & { Querystring: Record<string, string> }>(
      "/sandboxes/:id/files",
      { schema: removeDoc },
      async (request) => {
        const { path, recursive } = parseInput(fileDeleteQuery, request.query, "DELETE /files?path=<path>");
        await (await manager.agent(request.params.id)).remove(path, recursive ?? false);
        return { path, deleted: true };
      },
    );

    scope.get<Params & { Querystring: Record<string, string> }>(
      "/sandboxes/:id/files/stat",
      { schema: statDoc },
      async (request) => {
        const { path, sha256 } = parseInput(fileStatQuery, request.query, "GET /files/stat?path=<path>");
        return { path, ...(await (await manager.agent(request.params.id)).stat(path, { sha256: sha256 ?? false })) };
      },
    );

    scope.get<Params & { Querystring: Record<string, string> }>(
      "/sandboxes/:id/files/list",
      { schema: listDoc },
      async (request) => {
        const { path } = parseInput(fileQuery, request.query, "GET /files/list?path=<dir>");
        return { path, ...(await (await manager.agent(request.params.id)).list(path)) };
      },
    );

    scope.post<Params>("/sandboxes/:id/files/mkdir", { schema: mkdirDoc }, async (request) => {
      const { path, parents } = parseInput(mkdirRequest, request.body, "POST /files/mkdir");
      await (await manager.agent(request.params.id)).mkdir(path, parents ?? false);
      return { path, created: true };
    });

    scope.post<Params>("/sandboxes/:id/files/rename", { schema: renameDoc }, async (request) => {
      const { from, to } = parseInput(renameRequest, request.body, "POST /files/rename");
      await (await manager.agent(request.params.id)).rename(from, to);
      return { from, to, renamed: true };
    });
  });
}
