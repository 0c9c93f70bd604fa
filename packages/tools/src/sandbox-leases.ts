/**
 * Leasing a conversation's sandbox: the one it works in while that still exists (running, paused
 * or stopped), else a new one of its template, recorded as the conversation's; one create at a
 * time per conversation, every caller of the moment sharing it.
 */
import { BothyError } from "@bothy/protocol";
import { Sandbox, SandboxError, type ConnectionOptions } from "@bothy/sdk";
import type { ConversationRow, ToolStore } from "./tool-store.ts";
import type { ToolLog } from "./agent-tools.ts";

export interface SandboxLease {
  sandbox: Sandbox;
  /** Made for this call: the conversation had none, or its old one was gone (with its files). */
  fresh: boolean;
  replaced: boolean;
}

export class SandboxLeases {
  private readonly leasing = new Map<string, Promise<SandboxLease>>();

  constructor(
    private readonly store: ToolStore,
    /** The conversation's row; throws conversation_not_found as the tools do. */
    private readonly conversation: (id: string) => ConversationRow,
    /** Where the SDK reaches the API (read per call). */
    private readonly connection: () => ConnectionOptions,
    private readonly log: ToolLog,
  ) {}

  /** The conversation's running sandbox, made on first use; one create at a time per conversation. */
  get(conversationId: string): Promise<SandboxLease> {
    const pending = this.leasing.get(conversationId);
    if (pending) return pending;
    const lease = this.lease(conversationId).finally(() => this.leasing.delete(conversationId));
    this.leasing.set(conversationId, lease);
    return lease;
  }

  private async lease(conversationId: string): Promise<SandboxLease> {
    const conv = this.conversation(conversationId);
    if (conv.deleted_at)
      throw new BothyError("conversation_not_found", `Conversation ${conversationId} was deleted; start a new one.`);
    if (conv.sandbox_id) {
      const known = await Sandbox.connect(conv.sandbox_id, this.connection()).catch((err: unknown) => {
        if (err instanceof SandboxError && (err.code === "sandbox_not_found" || err.code === "invalid_sandbox_id"))
          return undefined;
        throw err;
      });
      const state = known?.info.state;
      if (known && (state === "running" || state === "paused" || state === "stopped"))
        return { sandbox: known, fresh: false, replaced: false };
    }
    const sandbox = await Sandbox.create({
      ...this.connection(),
      template: conv.template,
      ...(conv.vcpu === null ? {} : { vcpu: conv.vcpu }),
      ...(conv.memory_mib === null ? {} : { memoryMib: conv.memory_mib }),
    });
    this.store.setSandbox(conversationId, sandbox.sandboxId);
    this.log("info", "conversation_sandbox", {
      conversation_id: conversationId,
      sandbox_id: sandbox.sandboxId,
      replaced: conv.sandbox_id,
    });
    return { sandbox, fresh: true, replaced: conv.sandbox_id !== null };
  }

  /** Resolves once the lease under way for this conversation (if any) has settled, either way. */
  async settled(conversationId: string): Promise<void> {
    await this.leasing.get(conversationId)?.catch(() => undefined);
  }
}
