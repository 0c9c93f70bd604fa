/** `computer_export_file` and `send_file`: two acts, so a turn that exported but sent nothing can be flagged. */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";
import type { AgentTools } from "../agent-tools.ts";
import { DESCRIPTIONS } from "../guidance.ts";
import { okResult } from "../tool-result.ts";
import { resolvePath, withContext } from "../tool-context.ts";

export function registerDeliveryTools(server: McpServer, tools: AgentTools): void {
  server.registerTool(
    "computer_export_file",
    {
      title: "Export a file",
      description: DESCRIPTIONS.computer_export_file,
      inputSchema: {
        path: z.string().min(1).max(4096),
        name: z
          .string()
          .min(1)
          .max(255)
          .regex(/^[^/\0]+$/, "a file name without /")
          .optional()
          .describe("The name the user sees (default: the file's own)."),
      },
    },
    withContext(tools, "computer_export_file", async (args: { path: string; name?: string | undefined }, ctx) => {
      const exported = await tools.exportFile(
        ctx.conversationId,
        ctx.turnId,
        await ctx.sandbox(),
        resolvePath(args.path),
        args.name,
      );
      return okResult(
        `Exported ${exported.source_path} as ${exported.export_id}: ${exported.name}, ${exported.size} bytes, ${exported.media_type}. It is not delivered yet: call send_file with export_id ${exported.export_id} to attach it to your reply.`,
        { ...exported },
      );
    }),
  );

  server.registerTool(
    "send_file",
    {
      title: "Send a file",
      description: DESCRIPTIONS.send_file,
      inputSchema: { export_id: z.string().min(1).max(64).describe("The export id computer_export_file returned.") },
    },
    withContext(tools, "send_file", async (args: { export_id: string }, ctx) => {
      const sent = tools.send(ctx.conversationId, ctx.turnId, args.export_id);
      return okResult(
        `Attached ${sent.name} (${sent.export_id}, ${sent.size} bytes, ${sent.media_type}) to your reply in this turn.`,
        { ...sent },
      );
    }),
  );
}
