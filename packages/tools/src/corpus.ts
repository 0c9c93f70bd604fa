/**
 * The corpus: documents (CSV, plain text, Markdown, PDF) stored outside every sandbox, split into
 * passages and indexed with SQLite FTS5 for BM25-ranked search. A PDF is kept as it came; its
 * text (extracted in a throwaway sandbox, never on the host) is what gets indexed.
 */
import { createHash } from "node:crypto";
import { rename, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { BothyError } from "@bothy/protocol";
import { newId, type DocumentRow, type Passage, type SearchHit, type ToolStore } from "./tool-store.ts";
import { splitLines } from "./text-view.ts";

export const CORPUS_MEDIA_TYPES = ["text/csv", "text/plain", "text/markdown", "application/pdf"] as const;
export type CorpusMediaType = (typeof CORPUS_MEDIA_TYPES)[number];

const CSV_ROWS_PER_PASSAGE = 20;
const TEXT_CHARS_PER_PASSAGE = 1200;

/**
 * The corpus type of an upload: a specific Content-Type (text/csv, text/markdown) wins; else the
 * name's extension (clients often send text/plain or octet-stream for any file); else text/plain
 * when that was the Content-Type.
 */
export function corpusMediaType(contentType: string | undefined, name: string): CorpusMediaType | undefined {
  const type = (contentType ?? "").split(";")[0]?.trim().toLowerCase() ?? "";
  if (type === "text/csv" || type === "text/markdown" || type === "application/pdf") return type;
  if (type === "text/x-markdown") return "text/markdown";
  const ext = name.toLowerCase().split(".").pop();
  if (ext === "csv") return "text/csv";
  if (ext === "md" || ext === "markdown") return "text/markdown";
  if (ext === "pdf") return "application/pdf";
  if (ext === "txt" || ext === "text" || type === "text/plain") return "text/plain";
  return undefined;
}

/** CSV: the header and a run of rows per passage; text: paragraphs grouped to about 1200 characters. */
export function passagesOf(text: string, mediaType: CorpusMediaType): Passage[] {
  const lines = splitLines(text);
  const out: Passage[] = [];
  if (mediaType === "text/csv") {
    const header = lines[0] ?? "";
    for (let i = 1; i < lines.length; i += CSV_ROWS_PER_PASSAGE) {
      const rows = lines.slice(i, i + CSV_ROWS_PER_PASSAGE);
      out.push({ text: [header, ...rows].join("\n"), start_line: i + 1, end_line: i + rows.length });
    }
    if (lines.length === 1) out.push({ text: header, start_line: 1, end_line: 1 });
    return out;
  }
  let start = 0;
  let buf: string[] = [];
  const flush = (end: number): void => {
    const body = buf.join("\n").trim();
    if (body) out.push({ text: body, start_line: start + 1, end_line: end });
    buf = [];
  };
  lines.forEach((line, i) => {
    if (buf.length === 0) start = i;
    buf.push(line);
    const size = buf.reduce((n, l) => n + l.length + 1, 0);
    if ((line.trim() === "" && size >= TEXT_CHARS_PER_PASSAGE / 2) || size >= TEXT_CHARS_PER_PASSAGE) flush(i + 1);
  });
  flush(lines.length);
  return out;
}

/** Words of a free-text query as an FTS5 expression: each quoted (no FTS syntax from users), any may match. */
export function ftsQuery(query: string): string {
  const words = query.match(/[\p{L}\p{N}_]+/gu) ?? [];
  return words.map((w) => `"${w}"`).join(" OR ");
}

export class Corpus {
  constructor(
    private readonly store: ToolStore,
    private readonly dir: string,
  ) {}

  path(id: string): string {
    return join(this.dir, id);
  }

  /** `text`: what to index when the bytes are not text themselves (a PDF's extracted text). */
  async add(name: string, mediaType: CorpusMediaType, bytes: Buffer, text?: string): Promise<DocumentRow> {
    if (text === undefined) {
      try {
        text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
      } catch {
        throw new BothyError(
          "invalid_request",
          "The corpus takes UTF-8 text (CSV, plain text, Markdown) or PDF; convert the document to UTF-8 first.",
        );
      }
    }
    const doc: DocumentRow = {
      id: newId("doc"),
      name,
      media_type: mediaType,
      size: bytes.length,
      sha256: createHash("sha256").update(bytes).digest("hex"),
      lines: splitLines(text).length,
      created_at: new Date().toISOString(),
    };
    const tmp = `${this.path(doc.id)}.tmp`;
    await writeFile(tmp, bytes, { mode: 0o600 });
    await rename(tmp, this.path(doc.id));
    this.store.addDocument(doc, passagesOf(text, mediaType));
    return doc;
  }

  search(query: string, limit: number, documentId?: string): Array<SearchHit & { document: DocumentRow }> {
    const match = ftsQuery(query);
    if (!match) return [];
    return this.store.search(match, limit, documentId).flatMap((hit) => {
      const document = this.store.document(hit.document_id);
      return document ? [{ ...hit, document }] : [];
    });
  }
}
