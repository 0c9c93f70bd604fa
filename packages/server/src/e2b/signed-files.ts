import type { FastifyInstance, FastifyRequest } from "fastify";
import { z } from "zod";
import type { BothyError } from "@bothy/protocol";
import { isIn } from "../sandboxes/lifecycle.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import type { AccessTokens } from "./access-token.ts";
import { E2bHttpError, parseE2b, sendE2bError } from "./e2b-errors.ts";
import { fileRoutes } from "./envd-routes.ts";

const signedQuery = z.object({
  path: z.string().min(1, "path is required"),
  username: z.string().optional(),
  signature: z.string().startsWith("v1_", "signature is not one the e2b SDK makes"),
  signature_expiration: z.string().regex(/^\d+$/, "signature_expiration is unix seconds").optional(),
});

/**
 * The SDK's `uploadUrl()` / `downloadUrl()`: `/files` at the server's root (the SDK drops the
 * envd URL's path and sends no sandbox id), signed with an access token of the sandbox. The
 * sandbox is the one for which a current key's token verifies the signature (access-token.ts).
 */
export async function signedFileRoutes(
  app: FastifyInstance,
  manager: SandboxManager,
  tokens: AccessTokens,
  logProblem: (err: BothyError) => void,
): Promise<void> {
  const signer = new WeakMap<FastifyRequest, string>();
  await app.register(async (scope) => {
    scope.setErrorHandler((err, _request, reply) => sendE2bError(reply, err, logProblem));
    scope.addHook("onRequest", async (request, reply) => {
      const query = parseE2b(signedQuery, request.query, `${request.method} /files`);
      const expiration = query.signature_expiration;
      if (expiration !== undefined && Number(expiration) * 1000 < Date.now())
        throw new E2bHttpError(401, "This signed URL has expired; ask the SDK for a new one.");
      const op = {
        path: query.path,
        operation: request.method === "GET" ? ("read" as const) : ("write" as const),
        user: query.username,
        expiration,
      };
      const served = (await manager.list()).filter((s) => isIn("servable", s.state)).map((s) => s.sandbox_id);
      const id = await tokens.signerOf(served, op, query.signature);
      if (id === undefined) throw new E2bHttpError(401, "The signature matches no sandbox's file operation.");
      signer.set(request, id);
      await manager.ensureRunning(id);
      reply.raw.once("close", manager.hold(id));
    });
    await fileRoutes(scope, manager, (request) => {
      const id = signer.get(request);
      if (id === undefined) throw new E2bHttpError(401, "unsigned request");
      return id;
    });
  });
}
