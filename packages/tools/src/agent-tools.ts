/**
 * The state behind the tools: conversations (each with one sandbox, leased on first use by
 * sandbox-leases.ts), their turns (with the end-of-turn check), the exports each turn made and
 * sent (export-store.ts), and the corpus.
 */
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { BothyError, CLIENT_ID_RE, isErrorCode } from "@bothy/protocol";
import { NotFoundError, Sandbox, SandboxError, Snapshot, type ConnectionOptions } from "@bothy/sdk";
import { Corpus } from "./corpus.ts";
import { ExportStore, exportView, type ExportView } from "./export-store.ts";
import { SandboxLeases, type SandboxLease } from "./sandbox-leases.ts";
import { asBothyError, runToEnd } from "./sandbox-calls.ts";
import { newId, ToolStore, type CheckpointRow, type ConversationRow, type TurnRow } from "./tool-store.ts";

export type { ExportView, SandboxLease };

export const CONVERSATION_ID_RE = CLIENT_ID_RE;
export const TURN_ID_RE = CONVERSATION_ID_RE;

export type ToolLog = (level: "info" | "warn", event: string, fields: Record<string, unknown>) => void;

/** A tool call as the gate sees it, before the tool acts. */
export interface ToolCall {
  tool: string;
  conversationId: string;
  /** What the caller passed (shown to the person asked to approve). */
  args: unknown;
  /** The sandbox the conversation works in now, if it has one. */
  knownSandboxId: string | null;
  /** The conversation's sandbox id (its sandbox is made if it has none yet). */
  sandboxId(): Promise<string>;
  /** The API key behind the call (its id and scopes), when the server said. */
  caller: { keyId: string | null; scopes: readonly string[] } | undefined;
  /**
   * Asks the MCP client's user yes or no (MCP elicitation): undefined when there is no answer (the
   * client cannot ask, the user dismissed it, or `signal` ended the question).
   */
  askUser(message: string, signal: AbortSignal): Promise<"approve" | "deny" | undefined>;
}

/** Why a call may not run: a rule denies the tool, or a person did not approve it. */
export interface ToolRefusal {
  code: "policy_denied" | "not_approved";
  message: string;
}

/**
 * Judges a call before the tool acts: undefined lets it run, a refusal stops it. The server's
 * gate applies the sandbox's policy and holds an `ask` until a person decides; `signal` ends
 * with the call (its client gone).
 */
export type ToolGate = (call: ToolCall, signal: AbortSignal) => Promise<ToolRefusal | undefined>;

export interface AgentToolsOptions {
  /** State lives under `<home>/tools/`. */
  home: string;
  /** The sandbox API's base URL (read when first needed: the server knows it only once listening). */
  apiUrl: () => string;
  /** The key the tools call the sandbox API with (it decides whose sandboxes they reach). */
  apiKey?: string;
  /** Template of a conversation's sandbox when its creator names none; it also extracts PDF text (pdftotext). */
  defaultTemplate: string;
  defaultMemoryMib?: number;
  log: ToolLog;
  /** Judges every tool call before it acts; none: every call runs. */
  gate?: ToolGate;
}

export interface ConversationShape {
  conversation_id?: string | undefined;
  template?: string | undefined;
  vcpu?: number | undefined;
  memory_mib?: number | undefined;
  /** An existing sandbox to work in (checked with `checkSandbox` first). */
  sandbox_id?: string | undefined;
}

export interface TurnView {
  conversation_id: string;
  turn_id: string;
  state: TurnRow["state"];
  started_at: string;
  ended_at: string | null;
  warnings: string[];
  exports: ExportView[];
  attachments: Array<ExportView & { sent_at: string; url: string }>;
}

export class AgentTools {
  readonly store: ToolStore;
  readonly corpus: Corpus;
  private readonly exports: ExportStore;
  private readonly leases: SandboxLeases;

  private constructor(
    private readonly options: AgentToolsOptions,
    dir: string,
  ) {
    this.store = new ToolStore(join(dir, "tools.sqlite"));
    this.corpus = new Corpus(this.store, join(dir, "corpus"));
    this.exports = new ExportStore(this.store, join(dir, "exports"), options.log);
    this.leases = new SandboxLeases(
      this.store,
      (id) => this.conversation(id),
      () => this.connection(),
      options.log,
    );
  }

  static async open(options: AgentToolsOptions): Promise<AgentTools> {
    const dir = join(options.home, "tools");
    for (const sub of ["corpus", "exports"]) await mkdir(join(dir, sub), { recursive: true, mode: 0o700 });
    return new AgentTools(options, dir);
  }

  close(): void {
    this.store.close();
  }

  /** The gate's verdict on a call (undefined: it may run). */
  gate(call: ToolCall, signal: AbortSignal): Promise<ToolRefusal | undefined> {
    return this.options.gate?.(call, signal) ?? Promise.resolve(undefined);
  }

  /** Where the SDK reaches this server's API (read per call: the server knows it only once listening). */
  private connection(): ConnectionOptions {
    return {
      baseUrl: this.options.apiUrl(),
      ...(this.options.apiKey === undefined ? {} : { apiKey: this.options.apiKey }),
    };
  }

  // ---- conversations ------------------------------------------------------------------------

  createConversation(shape: ConversationShape): ConversationRow {
    const id = shape.conversation_id ?? newId("conv");
    if (!CONVERSATION_ID_RE.test(id))
      throw new BothyError(
        "invalid_request",
        "conversation_id: 1 to 128 letters, digits and _ . : -, starting with a letter or digit.",
      );
    const known = this.store.conversation(id);
    if (shape.sandbox_id !== undefined && known?.sandbox_id && known.sandbox_id !== shape.sandbox_id)
      throw new BothyError(
        "invalid_request",
        `Conversation ${id} works in sandbox ${known.sandbox_id} already; start a new conversation for ${shape.sandbox_id}.`,
      );
    const row = this.store.ensureConversation(id, {
      template: shape.template ?? this.options.defaultTemplate,
      vcpu: shape.vcpu,
      memory_mib: shape.memory_mib ?? this.options.defaultMemoryMib,
    });
    if (shape.sandbox_id === undefined || row.sandbox_id === shape.sandbox_id) return row;
    this.store.setSandbox(id, shape.sandbox_id);
    return this.conversation(id);
  }

  /** Fails as the API does (sandbox_not_found) unless the tools' key reaches this sandbox. */
  async checkSandbox(sandboxId: string): Promise<void> {
    try {
      await Sandbox.connect(sandboxId, this.connection());
    } catch (err) {
      throw asBothyError(err);
    }
  }

  conversation(id: string): ConversationRow {
    const row = this.store.conversation(id);
    if (!row)
      throw new BothyError(
        "conversation_not_found",
        `No conversation ${id.slice(0, 128)}; create it with POST /conversations or just use it in a tool call.`,
      );
    return row;
  }

  /**
   * A PDF's text, extracted where untrusted bytes belong: in a throwaway sandbox of the default
   * template (poppler's pdftotext), without network, deleted afterwards whatever happens.
   */
  async pdfText(pdf: Buffer): Promise<string> {
    const box = await Sandbox.create({
      ...this.connection(),
      template: this.options.defaultTemplate,
      memoryMib: 512,
      timeoutS: 300,
      network: { internet: false },
    }).catch((err: unknown) => {
      throw new BothyError(
        err instanceof SandboxError && isErrorCode(err.code) ? err.code : "internal",
        `Extracting the PDF's text needs a sandbox of the ${this.options.defaultTemplate} template: ${(err as Error).message}`,
      );
    });
    try {
      await box.files.write("/workspace/upload.pdf", pdf);
      let output = "";
      const keepTail = (text: string): void => {
        output = (output + text).slice(-2000);
      };
      const done = await runToEnd(box, "pdftotext -enc UTF-8 -layout upload.pdf upload.txt", {
        cwd: "/workspace",
        timeoutS: 120,
        keepOutput: false,
        onStdout: keepTail,
        onStderr: keepTail,
      });
      if (done.exitCode !== 0)
        throw new BothyError(
          "invalid_request",
          `This PDF's text could not be extracted (pdftotext: ${output.trim().slice(-500) || `exit ${String(done.exitCode)}`}).`,
        );
      const text = Buffer.from(await box.files.read("/workspace/upload.txt", { format: "bytes" }))
        .toString("utf8")
        .replaceAll("\f", "\n");
      if (!text.trim())
        throw new BothyError(
          "invalid_request",
          "This PDF has no text to index (a scan? run OCR on it in a sandbox with tesseract first).",
        );
      return text;
    } catch (err) {
      throw asBothyError(err);
    } finally {
      await box.kill().catch((err: unknown) =>
        this.options.log("warn", "pdf_sandbox_delete_failed", {
          sandbox_id: box.sandboxId,
          error: (err as Error).message,
        }),
      );
    }
  }

  /** The conversation's running sandbox, made on first use; one create at a time per conversation. */
  sandboxFor(conversationId: string): Promise<SandboxLease> {
    return this.leases.get(conversationId);
  }

  // ---- checkpoints --------------------------------------------------------------------------

  /**
   * A snapshot of the conversation's computer (its files; processes are not kept), recorded as
   * this conversation's: only it can restore it. The snapshot is unnamed in the API (names are
   * unique per tenant, which conversations share); `label` is the conversation's own.
   */
  async checkpoint(
    conversationId: string,
    sandbox: Sandbox,
    label: string | undefined,
  ): Promise<CheckpointRow & { bytes: number }> {
    try {
      const snap = await sandbox.snapshot();
      const row = this.store.addCheckpoint({
        snapshot_id: snap.snapshot_id,
        conversation_id: conversationId,
        label: label ?? null,
      });
      this.options.log("info", "conversation_checkpoint", {
        conversation_id: conversationId,
        sandbox_id: sandbox.sandboxId,
        snapshot_id: snap.snapshot_id,
      });
      return { ...row, bytes: snap.bytes };
    } catch (err) {
      throw asBothyError(err);
    }
  }

  /**
   * Replaces the conversation's computer with a new sandbox started from one of its checkpoints;
   * the old sandbox is deleted, with whatever it wrote since (the conversation's checkpoints stay).
   */
  async restore(conversationId: string, checkpointId: string): Promise<{ sandbox: Sandbox; replaced: string | null }> {
    const conv = this.conversation(conversationId);
    if (!this.store.checkpoint(conversationId, checkpointId))
      throw new BothyError(
        "snapshot_not_found",
        `No checkpoint ${checkpointId.slice(0, 64)} in this conversation; take one with computer_checkpoint and use the checkpoint_id it returns.`,
      );
    await this.leases.settled(conversationId);
    try {
      const sandbox = await Sandbox.create({
        ...this.connection(),
        snapshot: checkpointId,
        ...(conv.vcpu === null ? {} : { vcpu: conv.vcpu }),
        ...(conv.memory_mib === null ? {} : { memoryMib: conv.memory_mib }),
      });
      const old = this.store.conversation(conversationId)?.sandbox_id ?? null;
      this.store.setSandbox(conversationId, sandbox.sandboxId);
      this.options.log("info", "conversation_restored", {
        conversation_id: conversationId,
        snapshot_id: checkpointId,
        sandbox_id: sandbox.sandboxId,
        replaced: old,
      });
      // Waited for: a sandbox being deleted still holds its snapshot, which the conversation's delete removes.
      if (old) await Sandbox.kill(old, { ...this.connection(), wait: true });
      return { sandbox, replaced: old };
    } catch (err) {
      throw asBothyError(err);
    }
  }

  /** Deletes the conversation's sandbox and checkpoints; its turns, exports and attachments stay readable. */
  async deleteConversation(id: string): Promise<ConversationRow> {
    const conv = this.conversation(id);
    await this.leases.settled(id);
    const sandboxId = this.store.conversation(id)?.sandbox_id;
    try {
      if (sandboxId) await Sandbox.kill(sandboxId, { ...this.connection(), wait: true });
    } catch (err) {
      throw asBothyError(err);
    }
    // A checkpoint another sandbox still starts from (409) stays, listed in the tenant's snapshots.
    for (const c of this.store.checkpoints(id)) {
      const gone = await Snapshot.delete(c.snapshot_id, this.connection()).then(
        () => true,
        (err: unknown) => {
          if (err instanceof NotFoundError) return true;
          this.options.log("warn", "checkpoint_delete_failed", {
            conversation_id: id,
            snapshot_id: c.snapshot_id,
            error: (err as Error).message,
          });
          return false;
        },
      );
      if (gone) this.store.removeCheckpoint(c.snapshot_id);
    }
    if (conv.current_turn) this.endTurn(id, conv.current_turn);
    this.store.markDeleted(id);
    return this.conversation(id);
  }

  // ---- turns --------------------------------------------------------------------------------

  /** Begins a turn (ending the conversation's open one first, with its check). */
  beginTurn(conversationId: string, turnId: string = newId("turn")): TurnView {
    if (!TURN_ID_RE.test(turnId))
      throw new BothyError(
        "invalid_request",
        "turn_id: 1 to 128 letters, digits and _ . : -, starting with a letter or digit.",
      );
    const conv = this.conversation(conversationId);
    if (this.store.turn(conversationId, turnId))
      throw new BothyError(
        "invalid_request",
        `Turn ${turnId} already exists in conversation ${conversationId}; use a new turn id.`,
      );
    if (conv.current_turn) this.endTurn(conversationId, conv.current_turn);
    this.store.beginTurn(conversationId, turnId);
    return this.turnView(conversationId, turnId);
  }

  /** The turn a tool call belongs to: the one it names (begun if new), else the open one, else a new one. */
  turnForCall(conversationId: string, requested: string | undefined): string {
    const conv = this.conversation(conversationId);
    if (requested !== undefined) {
      const turn = this.store.turn(conversationId, requested);
      if (turn?.state === "ended")
        throw new BothyError(
          "turn_ended",
          `Turn ${requested} has ended; tool calls need an open turn: begin a new one with a new turn id.`,
        );
      if (!turn) this.beginTurn(conversationId, requested);
      return requested;
    }
    return conv.current_turn ?? this.beginTurn(conversationId).turn_id;
  }

  /**
   * Ends a turn. The end-of-turn check: a turn that exported files but sent none ends with a
   * warning, in the turn's record and in the log.
   */
  endTurn(conversationId: string, turnId: string): TurnView {
    const turn = this.turnRow(conversationId, turnId);
    if (turn.state === "ended") return this.turnView(conversationId, turnId);
    const exported = this.store.exportsOfTurn(conversationId, turnId);
    const sent = this.store.attachments(conversationId, turnId);
    const warnings: string[] = [];
    if (exported.length > 0 && sent.length === 0) {
      const names = exported.map((e) => `${e.name} (${e.id})`).join(", ");
      warnings.push(
        `This turn exported ${exported.length} file(s) but sent none, so the user received nothing: ${names}. Call send_file with an export id to deliver a file.`,
      );
      this.options.log("warn", "turn_exports_unsent", {
        conversation_id: conversationId,
        turn_id: turnId,
        exports: exported.map((e) => e.id),
      });
    }
    this.store.endTurn(conversationId, turnId, warnings);
    this.options.log("info", "turn_ended", {
      conversation_id: conversationId,
      turn_id: turnId,
      exports: exported.length,
      attachments: sent.length,
    });
    return this.turnView(conversationId, turnId);
  }

  private turnRow(conversationId: string, turnId: string): TurnRow {
    this.conversation(conversationId);
    const turn = this.store.turn(conversationId, turnId);
    if (!turn)
      throw new BothyError("turn_not_found", `Conversation ${conversationId} has no turn ${turnId.slice(0, 128)}.`);
    return turn;
  }

  turnView(conversationId: string, turnId: string): TurnView {
    const turn = this.turnRow(conversationId, turnId);
    const base = `/conversations/${encodeURIComponent(conversationId)}/turns/${encodeURIComponent(turnId)}`;
    return {
      conversation_id: conversationId,
      turn_id: turnId,
      state: turn.state,
      started_at: turn.started_at,
      ended_at: turn.ended_at,
      warnings: turn.warnings,
      exports: this.store.exportsOfTurn(conversationId, turnId).map(exportView),
      attachments: this.store
        .attachments(conversationId, turnId)
        .map((a) => ({ ...exportView(a), sent_at: a.sent_at, url: `${base}/attachments/${a.id}` })),
    };
  }

  // ---- exports ------------------------------------------------------------------------------

  exportPath(id: string): string {
    return this.exports.exportPath(id);
  }

  /** Copies a sandbox file into the export store, streaming and hashing it on the way. */
  exportFile(
    conversationId: string,
    turnId: string,
    sandbox: Sandbox,
    path: string,
    name?: string,
  ): Promise<ExportView> {
    return this.exports.exportFile(conversationId, turnId, sandbox, path, name);
  }

  /** Attaches an export of this conversation to the turn's reply. */
  send(conversationId: string, turnId: string, exportId: string): ExportView {
    return this.exports.send(conversationId, turnId, exportId);
  }

  /** An attachment of a turn, for serving its bytes. */
  attachment(conversationId: string, turnId: string, exportId: string): ExportView {
    this.turnRow(conversationId, turnId);
    return this.exports.attachment(conversationId, turnId, exportId);
  }
}
