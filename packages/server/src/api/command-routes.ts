import type { FastifyInstance } from "fastify";
import {
  BothyError,
  COMMAND_ID_RE,
  commandEvent,
  commandInfo,
  commandInput,
  commandList,
  commandRequest,
  commandResult,
  commandSocketQuery,
} from "@bothy/protocol";
import type { CommandRegistry } from "../commands/command-registry.ts";
import type { ServerEvents } from "../events/server-events.ts";
import type { DisconnectWatch } from "../sandboxes/disconnect-watch.ts";
import { onSandboxFinal } from "../sandboxes/sandbox-final.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import { CommandSession, type KeptHooks } from "./command-session.ts";
import { collectCommand, parseHttpCommand } from "./command-http.ts";
import type { BothySchema } from "./openapi.ts";
import { parseInput } from "./parse-input.ts";
import { empty, json } from "./route-schema.ts";

const tags = ["commands"];
const listDoc = { tags, summary: "List the sandbox's commands", response: { 200: json(commandList, "Commands") } };
const socketDoc: BothySchema = {
  tags,
  summary:
    "WebSocket: run one command (first message CommandRequest, then CommandInput; the server streams CommandEvent, process_exited or error last); with keep=true the socket stays open after each command and the next CommandRequest starts the next, one at a time",
  querystring: commandSocketQuery,
  response: { 101: empty("Switching to the WebSocket") },
  "x-websocket": { send: [commandRequest, commandInput], receive: commandEvent },
};
const runDoc = {
  tags,
  summary:
    "Run one command to its end in one request (no stdin, pty or background: those need the WebSocket); output past 16 MiB a stream is dropped with truncated: true; a client that leaves kills it",
  body: commandRequest,
  response: { 200: json(commandResult, "How it ended, with its output") },
};
const showDoc: BothySchema = {
  tags,
  summary: "Show a command; as a WebSocket, re-attach to its output (replay, then live)",
  response: { 200: json(commandInfo, "The command"), 101: empty("Re-attached over WebSocket") },
  "x-websocket": { send: [commandInput], receive: commandEvent },
};

const UPGRADE_HINT =
  "This endpoint is a WebSocket: connect with Upgrade: websocket (e.g. websocat ws://HOST/sandboxes/ID/command).";

export function commandRoutes(
  app: FastifyInstance,
  manager: SandboxManager,
  registry: CommandRegistry,
  watch: DisconnectWatch,
  serverEvents: ServerEvents,
): void {
  // Kept command sockets by sandbox: a sandbox that is over (deleted or failed) tells its own, so
  // an idle one closes.
  const kept = new Map<string, Set<CommandSession>>();
  onSandboxFinal(serverEvents, (id) => {
    for (const session of kept.get(id) ?? []) session.sandboxGone();
  });
  const remember = (id: string, session: CommandSession): void => {
    kept.set(id, (kept.get(id) ?? new Set()).add(session));
  };
  const forget = (id: string, session: CommandSession): void => {
    const sessions = kept.get(id);
    sessions?.delete(session);
    if (sessions?.size === 0) kept.delete(id);
  };

  app.get<{ Params: { id: string } }>("/sandboxes/:id/commands", { schema: listDoc }, async (request) => {
    await manager.info(request.params.id);
    return { commands: await registry.list(request.params.id) };
  });

  app.route<{ Params: { id: string }; Querystring: Record<string, string> }>({
    method: "GET",
    url: "/sandboxes/:id/command",
    schema: socketDoc,
    // Refuse before the upgrade, so a bad id or query gets a plain problem+json answer.
    preValidation: async (request) => {
      await requireRunning(manager, request.params.id);
      parseInput(commandSocketQuery, request.query, "GET /sandboxes/{id}/command[?keep=true]");
    },
    handler: async () => {
      throw new BothyError("upgrade_required", UPGRADE_HINT);
    },
    wsHandler: (socket, request) => {
      const id = request.params.id;
      const keep = commandSocketQuery.parse(request.query).keep === true;
      // `session` is read when the socket closes, by then made.
      const tracked = watch.track(id, socket, () => session.endedByServer);
      // A kept socket between commands is a connected client that does not keep its sandbox awake.
      const hooks: KeptHooks = { idle: (between) => tracked.idle(between), closed: () => forget(id, session) };
      const session = new CommandSession(socket, id, manager, registry, { kind: "new", ...(keep && { keep: hooks }) });
      if (keep) remember(id, session);
    },
  });

  // One command run to its end in one request, for clients that need no stream: the same start
  // and record as a socket's command; the output comes whole in the answer.
  app.post<{ Params: { id: string } }>("/sandboxes/:id/commands", { schema: runDoc }, async (request, reply) => {
    const id = request.params.id;
    // `agent` refuses a sandbox that is not running, before the body is looked at.
    const agent = await manager.agent(id);
    const command = registry.start(id, agent, parseHttpCommand(request.body));
    // Like a socket's owner, a client that leaves before the end takes its command with it.
    const onClose = (): void => {
      if (reply.raw.writableEnded) return;
      detach();
      if (!command.finished) command.signal("SIGKILL");
    };
    reply.raw.once("close", onClose);
    watch.track(id, reply.raw, () => reply.raw.writableEnded);
    const detach = collectCommand(command, (answer) => {
      reply.raw.off("close", onClose);
      void reply.send(answer);
    });
    return reply;
  });

  app.route<{ Params: { id: string; commandId: string } }>({
    method: "GET",
    url: "/sandboxes/:id/commands/:commandId",
    schema: showDoc,
    preValidation: async (request) => {
      await manager.info(request.params.id);
      const { commandId } = request.params;
      if (!COMMAND_ID_RE.test(commandId))
        throw new BothyError(
          "command_not_found",
          `"${commandId.slice(0, 64)}" is not a command id; ids look like cmd_ followed by 20 letters and digits.`,
        );
      if (!registry.get(request.params.id, commandId)) await registry.info(request.params.id, commandId);
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

/** Refuses a sandbox that cannot take a command now (unknown ids get their 404 from `info`). */
async function requireRunning(manager: SandboxManager, id: string): Promise<void> {
  const info = await manager.info(id);
  if (info.state !== "running")
    throw new BothyError(
      "sandbox_not_running",
      `Sandbox ${info.sandbox_id} is ${info.state}; only a running sandbox takes commands.`,
    );
}
