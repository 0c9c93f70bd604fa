import { posix } from "node:path";
import { Readable } from "node:stream";
import { createGunzip } from "node:zlib";
import busboy from "busboy";
import type { FastifyInstance, FastifyRequest } from "fastify";
import { z } from "zod";
import { BothyError, type SandboxInfo } from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";
import { isIn } from "../sandboxes/lifecycle.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import type { AccessTokens } from "./access-token.ts";
import { E2bHttpError, parseE2b } from "./e2b-errors.ts";
import { SANDBOX_FILE_HEADERS } from "../api/download-headers.ts";

/** envd's own port: the SDK names it in E2b-Sandbox-Port on every envd call. */
export const ENVD_PORT = "49983";
/** Where relative paths start, and a command's default directory (E2B's is /home/user). */
export const HOME = "/workspace";

const fileQuery = z.object({ path: z.string().min(1).optional(), username: z.string().optional() });

function header(request: FastifyRequest, name: string): string | undefined {
  const value = request.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/** bothy runs every command and file call as root; envd refuses a user that does not exist. */
export function checkUser(username: string | undefined): void {
  if (username !== undefined && username !== "root")
    throw new E2bHttpError(401, `User "${username}" does not exist in bothy sandboxes; omit the user (root).`);
}

/** The sandbox an envd call names (the onRequest hook has checked it and its token). */
export function envdSandboxId(request: FastifyRequest): string {
  const id = header(request, "e2b-sandbox-id");
  if (id === undefined) throw new E2bHttpError(400, "E2b-Sandbox-Id header missing");
  return id;
}

/**
 * Resolves E2b-Sandbox-Id to a live sandbox and checks its X-Access-Token. An unknown or gone
 * sandbox is 502, which the SDK reads as "not running anymore", as from E2B's own proxy.
 */
async function admit(manager: SandboxManager, tokens: AccessTokens, request: FastifyRequest): Promise<SandboxInfo> {
  const id = envdSandboxId(request);
  const port = header(request, "e2b-sandbox-port") ?? ENVD_PORT;
  // A well-formed other port was routed to bothy's port proxy before reaching here.
  if (port !== ENVD_PORT) throw new E2bHttpError(400, `E2b-Sandbox-Port ${port.slice(0, 16)} is not a TCP port`);
  let info: SandboxInfo;
  try {
    info = await manager.info(id);
  } catch (err) {
    if (err instanceof BothyError && (err.code === "sandbox_not_found" || err.code === "invalid_sandbox_id"))
      throw new E2bHttpError(502, `Sandbox ${id.slice(0, 64)} not found`);
    throw err;
  }
  if (!isIn("servable", info.state)) throw new E2bHttpError(502, `Sandbox ${id} is not running (it is ${info.state})`);
  if (!(await tokens.verify(id, header(request, "x-access-token"))))
    throw new E2bHttpError(
      401,
      "X-Access-Token is missing, not this sandbox's, or its API key was revoked or has expired; connect to the sandbox again with a current key (Sandbox.connect) for a new token.",
    );
  return info;
}

async function ensureParent(agent: AgentClient, path: string): Promise<void> {
  const dir = posix.dirname(path);
  if (dir !== "/" && dir !== ".") await agent.mkdir(dir, true);
}

function writeInfo(path: string): { path: string; name: string; type: "file" } {
  const abs = posix.resolve(HOME, path);
  return { path: abs, name: posix.basename(abs), type: "file" };
}

/**
 * envd under `/e2b/envd`: every call names its sandbox in E2b-Sandbox-Id and carries that
 * sandbox's access token; a dormant sandbox is woken first. `rpc` registers the Connect services.
 */
export async function envdRoutes(
  envd: FastifyInstance,
  manager: SandboxManager,
  tokens: AccessTokens,
  rpc: (scope: FastifyInstance) => Promise<void>,
): Promise<void> {
  envd.addHook("onRequest", async (request, reply) => {
    const info = await admit(manager, tokens, request);
    await manager.ensureRunning(info.sandbox_id).catch((err: unknown) => {
      // E2B's proxy answers traffic to a paused sandbox without auto-resume so.
      if (err instanceof BothyError && err.code === "sandbox_asleep")
        throw new E2bHttpError(
          409,
          "The sandbox is paused and was created without lifecycle.autoResume: resume it with Sandbox.connect(sandboxId), then call again.",
          { sandboxId: info.sandbox_id, canAutoResume: false },
        );
      throw err;
    });
    reply.raw.once("close", manager.hold(info.sandbox_id));
  });

  envd.get("/health", async (_request, reply) => reply.code(204).send());

  await envd.register(async (files) => fileRoutes(files, manager, envdSandboxId));

  await envd.register(async (scope) => rpc(scope));
}

/**
 * envd's `/files`: GET reads one file, POST writes (multipart or octet-stream, gzip allowed). The
 * sandbox comes from `sandboxOf`: the E2b-Sandbox-Id header, or the signature of a signed URL.
 */
export async function fileRoutes(
  files: FastifyInstance,
  manager: SandboxManager,
  sandboxOf: (request: FastifyRequest) => string,
): Promise<void> {
  // Uploads stream through to the guest; nothing is buffered here.
  files.addContentTypeParser("*", (_request, payload, done) => done(null, payload));

  files.get<{ Querystring: Record<string, string> }>("/files", async (request, reply) => {
    const { path, username } = parseE2b(fileQuery, request.query, "GET /files");
    checkUser(username);
    if (path === undefined) throw new E2bHttpError(400, "path is required");
    // The length is that of the file the guest opened (a symlink's target), so it is sent whole.
    const { stat, stream } = await (await manager.agent(sandboxOf(request))).openRead(path).catch((err: unknown) => {
      if (err instanceof BothyError && err.details?.["guest_code"] === "not_a_file")
        throw new E2bHttpError(400, `${path} is not a regular file`);
      throw err;
    });
    return reply
      .type("application/octet-stream")
      .headers(SANDBOX_FILE_HEADERS)
      .header("content-length", stat.size)
      .send(stream);
  });

  files.post<{ Querystring: Record<string, string> }>("/files", async (request) => {
    const { path, username } = parseE2b(fileQuery, request.query, "POST /files");
    checkUser(username);
    const agent = await manager.agent(sandboxOf(request));
    const body = (request.body as Readable | undefined) ?? Readable.from([]);
    const type = header(request, "content-type") ?? "";
    if (type.startsWith("multipart/form-data")) return writeMultipart(agent, request.headers, body, path);
    if (!type.startsWith("application/octet-stream"))
      throw new E2bHttpError(400, "Send files as multipart/form-data or application/octet-stream.");
    if (path === undefined) throw new E2bHttpError(400, "An octet-stream upload needs ?path=");
    const encoding = header(request, "content-encoding") ?? "identity";
    if (encoding !== "identity" && encoding !== "gzip")
      throw new E2bHttpError(400, `Content-Encoding ${encoding} is not supported; send gzip or none.`);
    await ensureParent(agent, path);
    await agent.writeStream(path, encoding === "gzip" ? body.pipe(createGunzip()) : body);
    return [writeInfo(path)];
  });
}

/**
 * One file per part: its target is `?path` for a single write, else the part's filename (the
 * SDK puts the full target path there). Parts are written one after another as they arrive.
 */
async function writeMultipart(
  agent: AgentClient,
  headers: FastifyRequest["headers"],
  body: Readable,
  path: string | undefined,
): Promise<ReturnType<typeof writeInfo>[]> {
  const parser = busboy({ headers, preservePath: true });
  const writes: Promise<ReturnType<typeof writeInfo>>[] = [];
  let failure: unknown;
  parser.on("file", (_field, stream, meta) => {
    const target = path ?? meta.filename;
    if (!target) {
      stream.resume();
      failure ??= new E2bHttpError(400, "A file part has no filename and the request no ?path");
      return;
    }
    const write = (async () => {
      await ensureParent(agent, target);
      await agent.writeStream(target, stream);
      return writeInfo(target);
    })();
    // A failed write must still drain its part, or the parser stalls and the request never ends.
    write.catch((err: unknown) => {
      failure ??= err;
      stream.resume();
    });
    writes.push(write);
  });
  await new Promise<void>((resolve, reject) => {
    parser.once("close", resolve);
    parser.once("error", (err) => reject(new E2bHttpError(400, `Malformed multipart body: ${(err as Error).message}`)));
    body.once("error", reject);
    body.pipe(parser);
  });
  const written = await Promise.allSettled(writes);
  if (failure !== undefined) throw failure;
  const infos = written.flatMap((w) => (w.status === "fulfilled" ? [w.value] : []));
  if (infos.length === 0) throw new E2bHttpError(400, "The upload holds no file part");
  return infos;
}
