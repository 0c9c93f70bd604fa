import type { FastifyInstance, FastifyRequest } from "fastify";
import { BothyError } from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import { ENVD_PREFIX } from "./port-rewrite.ts";

/** Where `@e2b/code-interpreter` finds its execute server inside the sandbox. */
export const CODE_INTERPRETER_PORT = 49999;
/**
 * The template's starter (templates/code-interpreter/server.py): starts the server detached unless
 * it listens, and returns once it does. Exit 127 means the sandbox's template has none.
 */
const START_CMD = "exec /usr/local/bin/bothy-code-interpreter --ensure-started";

function header(request: FastifyRequest, name: string): string | undefined {
  const value = request.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/** Runs a command inside the sandbox to its end; resolves with its exit code (null when signalled). */
function run(agent: AgentClient, cmd: string): Promise<number | null> {
  return new Promise((resolve, reject) => {
    agent.exec(
      { cmd },
      {
        onStarted: () => undefined,
        onOutput: (_fd, _data, consumed) => consumed(),
        onExited: (code) => resolve(code),
        onError: (err: BothyError) => reject(err),
      },
    );
  });
}

/**
 * The code interpreter's server starts on demand: a request for port 49999 through the E2B envd
 * URL that finds nothing listening there first runs the template's starter, then goes on to the
 * port proxy. A boot-time service would not do more: whatever ends the server (a cold wake, a
 * crash, a kill from inside) is repaired by the next request, on every driver, with no template
 * format or guest agent change. In a template without the starter the proxy answers as for any
 * closed port. Runs after the sandbox routes' own hook, which has woken the sandbox and holds it
 * awake while the request lasts (the port route is one of theirs).
 */
export function codeInterpreterStarter(app: FastifyInstance, manager: SandboxManager): void {
  app.addHook("preValidation", async (request) => {
    if (!request.originalUrl.startsWith(`${ENVD_PREFIX}/`)) return;
    if (header(request, "e2b-sandbox-port") !== String(CODE_INTERPRETER_PORT)) return;
    const id = header(request, "e2b-sandbox-id");
    if (id === undefined || request.url === request.originalUrl) return; // not routed to the port proxy
    const agent = await manager.agent(id);
    const ports = await agent.listPorts();
    if (ports.some((p) => p.port === CODE_INTERPRETER_PORT)) return;
    const code = await run(agent, START_CMD);
    if (code !== 0 && code !== 127)
      request.log.warn({ sandbox_id: id, exit_code: code }, "code interpreter server did not start");
  });
}
