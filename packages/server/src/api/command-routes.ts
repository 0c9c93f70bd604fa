import type { FastifyInstance } from "fastify";
import { BothyError, COMMAND_ID_RE } from "@bothy/protocol";
import type { CommandRegistry } from "../commands/command-registry.ts";
import type { DisconnectWatch } from "../sandboxes/disconnect-watch.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import { CommandSession } from "./command-session.ts";

const UPGRADE_HINT =
  "This endpoint is a WebSocket: connect with Upgrade: websocket (e.g. websocat ws://HOST/sandboxes/ID/command).";

export function commandRoutes(
  app: FastifyInstance,
  manager: SandboxManager,
  registry: CommandRegistry,
  watch: DisconnectWatch,
): void {
  app.get<{ Params: { id: string } }>("/sandboxes/:id/commands", async (request) => {
    manager.info(request.params.id);
    return { commands: registry.list(request.params.id) };
  });

  app.route<{ Params: { id: string } }>({
    method: "GET",
    url: "/sandboxes/:id/command",
    // Refuse before the upgrade, so a bad id gets a plain problem+json answer.
    preValidation: async (request) => {
      const info = manager.info(request.params.id);
      if (info.state !== "running")
        throw new BothyError(
          "sandbox_not_running",
          `Sandbox ${info.sandbox_id} is ${info.state}; only a running sandbox takes commands.`,
        );
    },
    handler: async () => {
      throw new BothyError("upgrade_required", UPGRADE_HINT);
    },
    wsHandler: (socket, request) => {
      const session = new CommandSession(socket, request.params.id, manager, registry, { kind: "new" });
      watch.track(request.params.id, socket, () => session.endedByServer);
    },
  });

  app.route<{ Params: { id: string; commandId: string } }>({
    method: "GET",
    url: "/sandboxes/:id/commands/:commandId",
    preValidation: async (request) => {
      manager.info(request.params.id);
      const { commandId } = request.params;
      if (!COMMAND_ID_RE.test(commandId))
        throw new BothyError(
          "command_not_found",
          `"${commandId.slice(0, 64)}" is not a command id; ids look like cmd_ followed by 20 letters and digits.`,
        );
      if (!registry.get(request.params.id, commandId)) registry.info(request.params.id, commandId);
    },
    handler: async (request) => {
      // Plain HTTP gets the command's record; a WebSocket re-attaches to its output.
      const live = registry.get(request.params.id, request.params.commandId);
      if (live) return registry.info(request.params.id, live.id);
      return registry.info(request.params.id, request.params.commandId);
    },
    wsHandler: (socket, request) => {
      const session = new CommandSession(socket, request.params.id, manager, registry, {
        kind: "attach",
        commandId: request.params.commandId,
      });
      watch.track(request.params.id, socket, () => session.endedByServer);
    },
  });
}
