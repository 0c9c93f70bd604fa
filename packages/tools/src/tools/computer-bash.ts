/** `computer_bash`: a shell command in the conversation's sandbox, its output streamed as it runs. */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { Sandbox } from "@bothy/sdk";
import { z } from "zod";
import type { AgentTools } from "../agent-tools.ts";
import { DESCRIPTIONS } from "../guidance.ts";
import { MiddleTruncator } from "../text-view.ts";
import { okResult, untrustedResult } from "../tool-result.ts";
import { runToEnd, type CommandEnd } from "../sandbox-calls.ts";
import { shellQuote, withContext, type Extra } from "../tool-context.ts";

const FLUSH_MS = 250;
const MAX_NOTIFICATION_CHARS = 8000;

/**
 * Sends output as it arrives, coalesced every 250 ms: as `notifications/progress` when the
 * caller gave a progress token, and always as a `notifications/message` log line.
 */
class OutputStreamer {
  private pending = "";
  private timer: NodeJS.Timeout | undefined;
  private sent = 0;
  /** Notifications go out one after another, and all before the result (a client drops progress that comes after it). */
  private chain: Promise<void> = Promise.resolve();

  constructor(private readonly extra: Extra) {}

  push(text: string): void {
    this.pending += text;
    this.timer ??= setTimeout(() => this.flush(), FLUSH_MS);
  }

  private flush(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    if (!this.pending) return;
    const text =
      this.pending.length > MAX_NOTIFICATION_CHARS ? `…${this.pending.slice(-MAX_NOTIFICATION_CHARS)}` : this.pending;
    this.pending = "";
    this.sent += 1;
    const progress = this.sent;
    const token = this.extra._meta?.progressToken;
    const send = (n: Parameters<Extra["sendNotification"]>[0]): Promise<void> =>
      this.extra.sendNotification(n).catch(() => undefined);
    this.chain = this.chain
      .then(() =>
        token === undefined
          ? undefined
          : send({ method: "notifications/progress", params: { progressToken: token, progress, message: text } }),
      )
      .then(() =>
        send({
          method: "notifications/message",
          params: { level: "info", logger: "computer_bash", data: { untrusted: true, output: text } },
        }),
      );
  }

  /** Sends what is pending and waits until every notification is out. */
  async drain(): Promise<void> {
    this.flush();
    await this.chain;
  }
}

/**
 * Waits for a background command to end, on the server's event stream (replayed from the start
 * for this sandbox, so an end that came first is not missed). Undefined when the sandbox is
 * deleted first, the stream ends, or `signal` aborts.
 */
async function commandExit(
  sandbox: Sandbox,
  commandId: string,
  signal: AbortSignal,
): Promise<{ exit_code: number | null; signal: string | null } | undefined> {
  for await (const ev of sandbox.events({ since: 0, signal })) {
    if (ev.type === "sandbox.deleted") return undefined;
    if (ev.type === "command.exited" && ev.data["command_id"] === commandId) {
      const { exit_code: code, signal: killedBy } = ev.data;
      return {
        exit_code: typeof code === "number" ? code : null,
        signal: typeof killedBy === "string" ? killedBy : null,
      };
    }
  }
  return undefined;
}

/**
 * Tells the client when a background command ends: a log notification on the session (no
 * request to hang it on any more), while the session lasts. The platform's event stream and
 * webhook carry the same `command.exited` for clients that are gone.
 */
function reportWhenDone(
  server: McpServer,
  sandbox: Sandbox,
  session: AbortSignal,
  ids: { conversationId: string; commandId: string },
): void {
  void commandExit(sandbox, ids.commandId, session)
    .then(async (exit) => {
      if (!exit || session.aborted) return;
      await server.server.notification({
        method: "notifications/message",
        params: {
          level: "info",
          logger: "computer_bash",
          data: {
            event: "command_exited",
            conversation_id: ids.conversationId,
            command_id: ids.commandId,
            exit_code: exit.exit_code,
            signal: exit.signal,
          },
        },
      });
    })
    .catch(() => undefined);
}

export function registerComputerBash(server: McpServer, tools: AgentTools, session: AbortSignal): void {
  server.registerTool(
    "computer_bash",
    {
      title: "Run a command",
      description: DESCRIPTIONS.computer_bash,
      inputSchema: {
        command: z
          .string()
          .min(1)
          .max(256 * 1024)
          .describe("The shell line, run with bash -c in /workspace."),
        timeout_s: z
          .number()
          .int()
          .min(1)
          .max(3600)
          .optional()
          .describe("Kill it after this many seconds (default 300)."),
        background: z
          .boolean()
          .optional()
          .describe("Start it and return at once; redirect its output to a file to read later."),
      },
      annotations: { openWorldHint: true },
    },
    withContext(
      tools,
      "computer_bash",
      async (args: { command: string; timeout_s?: number | undefined; background?: boolean | undefined }, ctx) => {
        const sandbox = await ctx.sandbox();
        const cmd = `exec bash -c ${shellQuote(args.command)}`;
        if (args.background) {
          const started = await sandbox.commands.run(cmd, {
            cwd: "/workspace",
            background: true,
            ...(args.timeout_s ? { timeoutS: args.timeout_s } : {}),
          });
          // The command runs on without this socket; its end is reported from the event stream.
          started.disconnect();
          reportWhenDone(server, sandbox, session, {
            conversationId: ctx.conversationId,
            commandId: started.commandId,
          });
          return okResult(
            `Started in the background as ${started.commandId}. Its output is not returned: if you did not redirect it to a file (cmd > /workspace/job.log 2>&1 &), you cannot read it. You are told when it ends (a log notification with its exit code); check on it with computer_bash (e.g. cat the log, or ps).`,
            { command_id: started.commandId },
          );
        }
        const output = new MiddleTruncator();
        const streamer = new OutputStreamer(ctx.extra);
        const onText = (text: string): void => {
          output.push(text);
          streamer.push(text);
        };
        let result: CommandEnd;
        try {
          result = await runToEnd(sandbox, cmd, {
            cwd: "/workspace",
            timeoutS: args.timeout_s ?? 300,
            keepOutput: false,
            onStdout: onText,
            onStderr: onText,
            signal: ctx.extra.signal,
          });
        } finally {
          await streamer.drain();
        }
        const status = result.timedOut
          ? `Timed out after ${args.timeout_s ?? 300} s and was killed.`
          : result.exitCode === null
            ? `Ended by signal ${result.signal ?? "?"}.`
            : `Exit code ${result.exitCode}.`;
        const text = output.toString();
        return untrustedResult("sandbox", `${status}${text ? " Output (stdout and stderr):" : " No output."}`, text, {
          command_id: result.commandId,
          exit_code: result.exitCode,
          ...(result.signal ? { signal: result.signal } : {}),
          ...(output.omitted > 0 ? { omitted_chars: output.omitted } : {}),
        });
      },
    ),
  );
}
