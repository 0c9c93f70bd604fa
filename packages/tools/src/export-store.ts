/**
 * The tools' export store: files copied out of a conversation's sandbox (streamed and hashed on
 * the way, kept under `<home>/tools/exports/`), and the exports a turn sent to its user.
 */
import { createHash } from "node:crypto";
import { createWriteStream } from "node:fs";
import { open, rename, rm } from "node:fs/promises";
import { basename, join } from "node:path";
import { pipeline } from "node:stream/promises";
import { Readable, Transform } from "node:stream";
import type { ReadableStream as NodeReadableStream } from "node:stream/web";
import { BothyError } from "@bothy/protocol";
import type { Sandbox } from "@bothy/sdk";
import { mediaTypeOf } from "./text-view.ts";
import { newId, type ExportRow, type ToolStore } from "./tool-store.ts";
import type { ToolLog } from "./agent-tools.ts";

export interface ExportView {
  export_id: string;
  name: string;
  size: number;
  media_type: string;
  sha256: string;
  source_path: string;
  created_at: string;
}

export const exportView = (e: ExportRow): ExportView => ({
  export_id: e.id,
  name: e.name,
  size: e.size,
  media_type: e.media_type,
  sha256: e.sha256,
  source_path: e.source_path,
  created_at: e.created_at,
});

export class ExportStore {
  constructor(
    private readonly store: ToolStore,
    private readonly dir: string,
    private readonly log: ToolLog,
  ) {}

  exportPath(id: string): string {
    return join(this.dir, id);
  }

  /** Copies a sandbox file into the export store, streaming and hashing it on the way. */
  async exportFile(
    conversationId: string,
    turnId: string,
    sandbox: Sandbox,
    path: string,
    name?: string,
  ): Promise<ExportView> {
    const id = newId("exp");
    const tmp = `${this.exportPath(id)}.tmp`;
    const hash = createHash("sha256");
    let size = 0;
    const counter = new Transform({
      transform(chunk: Buffer, _enc, done) {
        hash.update(chunk);
        size += chunk.length;
        done(null, chunk);
      },
    });
    try {
      const source = (await sandbox.files.read(path, { format: "stream" })) as NodeReadableStream<Uint8Array>;
      await pipeline(Readable.fromWeb(source), counter, createWriteStream(tmp, { mode: 0o600 }));
      await rename(tmp, this.exportPath(id));
    } catch (err) {
      await rm(tmp, { force: true });
      throw err;
    }
    const head = Buffer.alloc(16);
    const fh = await open(this.exportPath(id));
    try {
      await fh.read(head, 0, 16, 0);
    } finally {
      await fh.close();
    }
    const fileName = name ?? basename(path);
    const row: ExportRow = {
      id,
      conversation_id: conversationId,
      turn_id: turnId,
      source_path: path,
      name: fileName,
      size,
      media_type: mediaTypeOf(fileName, head.subarray(0, Math.min(size, 16))),
      sha256: hash.digest("hex"),
      created_at: new Date().toISOString(),
    };
    this.store.addExport(row);
    this.log("info", "file_exported", {
      conversation_id: conversationId,
      turn_id: turnId,
      export_id: id,
      size,
      media_type: row.media_type,
    });
    return exportView(row);
  }

  /** Attaches an export of this conversation to the turn's reply. */
  send(conversationId: string, turnId: string, exportId: string): ExportView {
    const row = this.store.export(exportId);
    if (!row || row.conversation_id !== conversationId)
      throw new BothyError(
        "export_not_found",
        `No export ${exportId.slice(0, 64)} in this conversation; export the file with computer_export_file and use the export_id it returns.`,
      );
    this.store.attach(conversationId, turnId, exportId);
    this.log("info", "file_sent", { conversation_id: conversationId, turn_id: turnId, export_id: exportId });
    return exportView(row);
  }

  /** An attachment of a turn (the caller checked the turn exists), for serving its bytes. */
  attachment(conversationId: string, turnId: string, exportId: string): ExportView {
    const found = this.store.attachments(conversationId, turnId).find((a) => a.id === exportId);
    if (!found)
      throw new BothyError(
        "export_not_found",
        `Turn ${turnId} of conversation ${conversationId} has no attachment ${exportId.slice(0, 64)}.`,
      );
    return exportView(found);
  }
}
