/** `computer_checkpoint` and `computer_restore`: keep the computer's files as they are, and go back to them. */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";
import type { AgentTools } from "../agent-tools.ts";
import { DESCRIPTIONS } from "../guidance.ts";
import { okResult } from "../tool-result.ts";
import { withContext } from "../tool-context.ts";

export function registerCheckpointTools(server: McpServer, tools: AgentTools): void {
  server.registerTool(
    "computer_checkpoint",
    {
      title: "Checkpoint the computer",
      description: DESCRIPTIONS.computer_checkpoint,
      inputSchema: {
        label: z.string().min(1).max(200).optional().describe("A note for yourself on what this state is."),
      },
    },
    withContext(tools, "computer_checkpoint", async (args: { label?: string | undefined }, ctx) => {
      const row = await tools.checkpoint(ctx.conversationId, await ctx.sandbox(), args.label);
      return okResult(
        `Checkpoint ${row.snapshot_id} taken: every file of your computer as it is now (${row.bytes} bytes changed over its template; running processes are not kept). computer_restore with checkpoint_id ${row.snapshot_id} brings your computer back to exactly this.`,
        { checkpoint_id: row.snapshot_id, label: row.label, bytes: row.bytes, created_at: row.created_at },
      );
    }),
  );

  server.registerTool(
    "computer_restore",
    {
      title: "Restore a checkpoint",
      description: DESCRIPTIONS.computer_restore,
      inputSchema: {
        checkpoint_id: z.string().min(1).max(64).describe("The checkpoint_id computer_checkpoint returned."),
      },
      annotations: { destructiveHint: true },
    },
    withContext(tools, "computer_restore", async (args: { checkpoint_id: string }, ctx) => {
      const { sandbox, replaced } = await tools.restore(ctx.conversationId, args.checkpoint_id);
      return okResult(
        `Your computer is back at checkpoint ${args.checkpoint_id}: a new sandbox (${sandbox.sandboxId}) with the files as they were then. ${replaced ? `The previous one (${replaced}) was deleted with everything written since the checkpoint, and its running processes; start again any service you need.` : "There was no computer to replace."}`,
        { checkpoint_id: args.checkpoint_id, sandbox_id: sandbox.sandboxId, replaced },
      );
    }),
  );
}
