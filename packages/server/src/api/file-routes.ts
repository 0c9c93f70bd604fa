import type { FastifyInstance, FastifyRequest } from "fastify";
import type { Readable } from "node:stream";
import {
  BothyError,
  fileDeleteQuery,
  fileQuery,
  fileStatQuery,
  fileWriteQuery,
  mkdirRequest,
  renameRequest,
} from "@bothy/protocol";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import { parseInput } from "./parse-input.ts";
import { SANDBOX_FILE_HEADERS } from "./download-headers.ts";

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

    scope.get<Params & { Querystring: Record<string, string> }>("/sandboxes/:id/files", async (request, reply) => {
      const { path } = parseInput(fileQuery, request.query, "GET /files?path=<file>");
      // The length is that of the file the guest opened, so a symlink's target is sent whole.
      const { stat, stream } = await manager
        .agent(request.params.id)
        .openRead(path)
        .catch((err: unknown) => {
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
    });

    scope.put<Params & { Querystring: Record<string, string> }>("/sandboxes/:id/files", async (request) => {
      const { path, mode } = parseInput(fileWriteQuery, request.query, "PUT /files?path=<file>");
      const expected = ifMatch(request);
      const body = (request.body as Readable | undefined) ?? [];
      const agent = manager.agent(request.params.id);
      const written = await agent.writeStream(path, body, {
        mode: mode === undefined ? undefined : parseInt(mode, 8),
        ifSha256: expected,
      });
      return { path, ...written };
    });

    scope.delete<Params & { Querystring: Record<string, string> }>("/sandboxes/:id/files", async (request) => {
      const { path, recursive } = parseInput(fileDeleteQuery, request.query, "DELETE /files?path=<path>");
      await manager.agent(request.params.id).remove(path, recursive ?? false);
      return { path, deleted: true };
    });

    scope.get<Params & { Querystring: Record<string, string> }>("/sandboxes/:id/files/stat", async (request) => {
      const { path, sha256 } = parseInput(fileStatQuery, request.query, "GET /files/stat?path=<path>");
      return { path, ...(await manager.agent(request.params.id).stat(path, { sha256: sha256 ?? false })) };
    });

    scope.get<Params & { Querystring: Record<string, string> }>("/sandboxes/:id/files/list", async (request) => {
      const { path } = parseInput(fileQuery, request.query, "GET /files/list?path=<dir>");
      return { path, ...(await manager.agent(request.params.id).list(path)) };
    });

    scope.post<Params>("/sandboxes/:id/files/mkdir", async (request) => {
      const { path, parents } = parseInput(mkdirRequest, request.body, "POST /files/mkdir");
      await manager.agent(request.params.id).mkdir(path, parents ?? false);
      return { path, created: true };
    });

    scope.post<Params>("/sandboxes/:id/files/rename", async (request) => {
      const { from, to } = parseInput(renameRequest, request.body, "POST /files/rename");
      await manager.agent(request.params.id).rename(from, to);
      return { from, to, renamed: true };
    });
  });
}
