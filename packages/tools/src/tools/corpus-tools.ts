/** `computer_fetch_document` and `rag_search` over the corpus stored outside every sandbox. */
import { createReadStream } from "node:fs";
import { readFile } from "node:fs/promises";
import { posix } from "node:path";
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";
import { BothyError } from "@bothy/protocol";
import type { AgentTools } from "../agent-tools.ts";
import { DESCRIPTIONS, FRAGMENT_NOTICE } from "../guidance.ts";
import { okResult, untrustedResult } from "../tool-result.ts";
import { resolvePath, withContext } from "../tool-context.ts";

export function registerCorpusTools(server: McpServer, tools: AgentTools): void {
  server.registerTool(
    "computer_fetch_document",
    {
      title: "Fetch a corpus document",
      description: DESCRIPTIONS.computer_fetch_document,
      inputSchema: {
        document_id: z
          .string()
          .min(1)
          .max(64)
          .optional()
          .describe("The document's id (doc_…), as rag_search shows it."),
        name: z.string().min(1).max(255).optional().describe("Or the document's name (the newest of that name)."),
        path: z.string().min(1).max(4096).optional().describe("Where to put it (default /workspace/documents/<name>)."),
      },
    },
    withContext(
      tools,
      "computer_fetch_document",
      async (args: { document_id?: string | undefined; name?: string | undefined; path?: string | undefined }, ctx) => {
        const doc = args.document_id
          ? tools.store.document(args.document_id)
          : args.name
            ? tools.store.documentByName(args.name)
            : undefined;
        if (!doc) {
          const known = tools.store
            .documents()
            .slice(0, 20)
            .map((d) => `${d.id} (${d.name})`)
            .join(", ");
          throw new BothyError(
            "document_not_found",
            `No such corpus document${args.document_id || args.name ? ` ${args.document_id ?? args.name}` : " (give document_id or name)"}. ${known ? `Documents: ${known}.` : "The corpus is empty."}`,
          );
        }
        const dest = resolvePath(args.path ?? `documents/${doc.name}`);
        const sandbox = await ctx.sandbox();
        await sandbox.files.makeDir(posix.dirname(dest));
        const written = await sandbox.files.write(dest, createReadStream(tools.corpus.path(doc.id)));
        let shape =
          doc.media_type === "application/pdf"
            ? `a PDF whose text (${doc.lines} lines) is what rag_search searches; extract it here with pdftotext -layout`
            : `${doc.lines} lines`;
        if (doc.media_type === "text/csv") {
          const head = (await readFile(tools.corpus.path(doc.id), "utf8")).split("\n", 1)[0] ?? "";
          shape = `${Math.max(doc.lines - 1, 0)} data rows under the header: ${head.slice(0, 500)}`;
        }
        return okResult(
          `Fetched ${doc.name} (${doc.id}) whole into the sandbox at ${dest}: ${written.size} bytes, ${shape}. Compute totals and counts over this file with code (python/pandas, or sqlite3 for big files), not from search fragments.`,
          { document_id: doc.id, path: dest, size: written.size, sha256: written.sha256 },
        );
      },
    ),
  );

  server.registerTool(
    "rag_search",
    {
      title: "Search the corpus",
      description: DESCRIPTIONS.rag_search,
      inputSchema: {
        query: z.string().min(1).max(1000),
        limit: z.number().int().min(1).max(20).optional().describe("How many passages (default 5)."),
        document_id: z.string().min(1).max(64).optional().describe("Search only this document."),
      },
      annotations: { readOnlyHint: true },
    },
    withContext(
      tools,
      "rag_search",
      async (args: { query: string; limit?: number | undefined; document_id?: string | undefined }) => {
        const hits = tools.corpus.search(args.query, args.limit ?? 5, args.document_id);
        if (hits.length === 0)
          return okResult(`No passages match "${args.query}". Try other words; list documents with GET /corpus.`, {
            results: [],
          });
        const blocks = hits.map((h, i) =>
          [
            `Result ${i + 1}: document ${h.document.id} (${h.document.name}), lines ${h.start_line}-${h.end_line} of ${h.document.lines}.`,
            `FRAGMENT: ${FRAGMENT_NOTICE}`,
            h.text,
          ].join("\n"),
        );
        const results = hits.map((h) => ({
          document_id: h.document_id,
          name: h.document.name,
          start_line: h.start_line,
          end_line: h.end_line,
          total_lines: h.document.lines,
          fragment: true,
          score: -h.rank,
        }));
        return untrustedResult(
          "corpus",
          `${hits.length} passage(s), best first. Each is a fragment of its document. ${FRAGMENT_NOTICE}`,
          blocks.join("\n\n"),
          { results },
        );
      },
    ),
  );
}
