import { fastifyConnectPlugin } from "@connectrpc/connect-fastify";
import type { FastifyInstance } from "fastify";
import type { BothyError } from "@bothy/protocol";
import type { CommandRegistry } from "../commands/command-registry.ts";
import type { Quotas } from "../auth/quotas.ts";
import type { Config } from "../config.ts";
import type { LedgerStore } from "../ledger/store.ts";
import type { ServerEvents } from "../events/server-events.ts";
import { onSandboxFinal } from "../sandboxes/sandbox-final.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import type { AccessTokens } from "./access-token.ts";
import { codeInterpreterStarter } from "./code-interpreter.ts";
import { connectionShape, controlPlaneRoutes } from "./control-plane.ts";
import { e2bSnapshotRoutes } from "./e2b-snapshots.ts";
import type { SnapshotService } from "../snapshots/snapshot-service.ts";
import { e2bVolumeRoutes } from "./e2b-volumes.ts";
import type { VolumeService } from "../volumes/volume-service.ts";
import { envdRoutes } from "./envd-routes.ts";
import { filesystemService } from "./filesystem-service.ts";
import { Filesystem } from "./gen/filesystem_pb.ts";
import { Process } from "./gen/process_pb.ts";
import { processService } from "./process-service.ts";
import { E2bHttpError, sendE2bError } from "./e2b-errors.ts";
import { E2bState, vaultSealer } from "./e2b-state.ts";
import type { Vault } from "../gateway/vault.ts";
import { signedFileRoutes } from "./signed-files.ts";
import type { DesktopService } from "../desktop/desktop-service.ts";
import type { LinkTokens } from "../auth/link-tokens.ts";
import { mapDesktopCommand } from "./desktop-commands.ts";
import type { DesktopStreams } from "./desktop-stream.ts";
import { streamPageRoutes } from "./stream-page.ts";

export interface E2bDeps {
  config: Config;
  /** The sandboxes' envd and traffic tokens (also checked by the auth hooks for port traffic). */
  tokens: AccessTokens;
  manager: SandboxManager;
  registry: CommandRegistry;
  serverEvents: ServerEvents;
  /** The server's own error accounting (metrics, and a log line for 5xx), shared with its routes. */
  logProblem: (err: BothyError) => void;
  ledger: LedgerStore;
  quotas: Quotas;
  /** Seals the create's envVars the ledger keeps. */
  vault: Vault;
  /** The desktop `@e2b/desktop`'s commands are answered by, and its live view's state and links. */
  desktop: DesktopService;
  streams: DesktopStreams;
  links: LinkTokens;
  volumes: VolumeService;
  snapshots: SnapshotService;
}

/**
 * The E2B-compatible surface, for the unmodified `e2b` SDK: its control plane under `/e2b`, its
 * in-sandbox daemon (envd) under `/e2b/envd`, and `/files` for the SDK's signed URLs, all mapped
 * onto bothy's own sandboxes, commands and files. Errors are E2B's `{"code","message"}`, not problem+json.
 * The control plane takes a bothy API key in E2B's X-API-Key (bothy's auth hooks check it, as on
 * every route); envd calls and signed URLs carry the sandbox's own access token instead.
 */
export async function e2bRoutes(app: FastifyInstance, deps: E2bDeps): Promise<void> {
  const { tokens } = deps;
  const state = new E2bState(deps.ledger.e2b, vaultSealer(deps.vault), (sandboxId, err) =>
    deps.serverEvents.emit("e2b_envs_unreadable", { sandbox_id: sandboxId, error: err.message }),
  );
  // A sandbox that ended for good (deleted, or failed and never coming back) needs none of it.
  onSandboxFinal(deps.serverEvents, (id) => {
    state.forget(id);
    deps.streams.forget(id);
  });
  await app.register(
    async (e2b) => {
      e2b.setErrorHandler((err, _request, reply) => sendE2bError(reply, err, deps.logProblem));
      e2b.setNotFoundHandler((request, reply) =>
        sendE2bError(
          reply,
          new E2bHttpError(404, `No E2B route ${request.method} ${request.url.split("?")[0]} on bothy`),
          deps.logProblem,
        ),
      );
      controlPlaneRoutes(e2b, deps, tokens, state, deps.config.previewDomain ?? null);
      streamPageRoutes(e2b, deps.streams, deps.links);
      e2bVolumeRoutes(e2b, deps.volumes);
      e2bSnapshotRoutes(e2b, deps.snapshots, state, connectionShape(tokens, deps.config.previewDomain ?? null));
      await e2b.register(
        (envd) =>
          envdRoutes(envd, deps.manager, tokens, async (scope) => {
            await scope.register(fastifyConnectPlugin, {
              // envd's clients may be newer than its protos.
              jsonOptions: { ignoreUnknownFields: true },
              routes: (router) => {
                router.service(
                  Process,
                  processService(deps.manager, deps.registry, state, (ctx, sandboxId, line) =>
                    mapDesktopCommand(line, {
                      sandboxId,
                      binding: tokens.envdBinding(sandboxId, ctx.requestHeader.get("x-access-token") ?? undefined),
                      desktop: deps.desktop,
                      streams: deps.streams,
                      agent: () => deps.manager.agent(sandboxId),
                    }),
                  ),
                );
                router.service(Filesystem, filesystemService(deps.manager));
              },
            });
          }),
        { prefix: "/envd" },
      );
    },
    { prefix: "/e2b" },
  );
  await signedFileRoutes(app, deps.manager, tokens, deps.logProblem);
  codeInterpreterStarter(app, deps.manager);
}
