/**
 * The agent tools end to end: a real bothy server (gVisor sandboxes of the `charts` and `seed` templates),
 * the MCP SDK's own Client over streamable HTTP and over stdio (`bothy mcp`).
 */
import { randomBytes } from "node:crypto";
import { readdir, readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { getDefaultEnvironment, StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { LoggingMessageNotificationSchema, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { PNG } from "pngjs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { noLeaks } from "../../server/test/helpers/host-state.ts";
import { api, waitDeleted, waitNoneDeleting } from "../../server/test/helpers/client.ts";
import { driverTitle, testDriver } from "../../server/test/helpers/drivers.ts";
import { startTestServer, type TestServer } from "../../server/test/helpers/test-server.ts";
import { TOOL_NAMES } from "../src/index.ts";

const BOTHY = fileURLToPath(new URL("../../cli/bin/bothy.js", import.meta.url));
const gvisor = testDriver("gvisor");

const REGIONS = ["North", "South", "East", "West"];
/** 120 rows of sales: revenue per region is known, so the chart's totals can be checked. */
function salesCsv(): { csv: string; totals: Record<string, number> } {
  const totals: Record<string, number> = {};
  const rows = ["date,region,product,revenue"];
  for (let i = 0; i < 120; i++) {
    const region = REGIONS[i % 4] ?? "North";
    const revenue = 100 + ((i * 37) % 250);
    totals[region] = (totals[region] ?? 0) + revenue;
    rows.push(`2026-01-${String((i % 28) + 1).padStart(2, "0")},${region},widget-${i % 3},${revenue}`);
  }
  return { csv: `${rows.join("\n")}\n`, totals };
}

const CHART_PY = `import pandas as pd
import matplotlib.pyplot as plt
df = pd.read_csv("/workspace/documents/sales.csv")
by_region = df.groupby("region")["revenue"].sum().sort_index()
print("rendering chart")
for region, total in by_region.items():
    print(f"{region}={total}")
ax = by_region.plot.bar(title="Revenue by region")
ax.set_ylabel("revenue")
plt.tight_layout()
plt.savefig("/workspace/revenue.png", dpi=60)
print("saved")
`;

/** A one-page PDF whose only text is `line` (Helvetica), with a correct cross-reference table. */
function minimalPdf(line: string): Buffer {
  const content = `BT /F1 12 Tf 72 720 Td (${line}) Tj ET`;
  const objects = [
    "<< /Type /Catalog /Pages 2 0 R >>",
    "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
    "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
    "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    `<< /Length ${content.length} >>\nstream\n${content}\nendstream`,
  ];
  let out = "%PDF-1.4\n";
  const offsets: number[] = [];
  objects.forEach((body, i) => {
    offsets.push(out.length);
    out += `${i + 1} 0 obj\n${body}\nendobj\n`;
  });
  const xref = out.length;
  out += `xref\n0 ${objects.length + 1}\n0000000000 65535 f \n${offsets.map((o) => `${String(o).padStart(10, "0")} 00000 n \n`).join("")}`;
  out += `trailer\n<< /Size ${objects.length + 1} /Root 1 0 R >>\nstartxref\n${xref}\n%%EOF\n`;
  return Buffer.from(out, "latin1");
}

/** A PNG of random RGB pixels: incompressible, so a 2400x600 one is over 4 MB. */
function noisePng(width: number, height: number): Buffer {
  const png = new PNG({ width, height });
  png.data = randomBytes(width * height * 4);
  return PNG.sync.write(png, { colorType: 2 });
}

/** A PNG whose header claims `width`x`height`, with `idat` as its pixel data (never decoded here). */
function pngWithHeader(width: number, height: number, idat: Buffer): Buffer {
  const chunk = (type: string, data: Buffer): Buffer => {
    const head = Buffer.alloc(8);
    head.writeUInt32BE(data.length, 0);
    head.write(type, 4, "latin1");
    return Buffer.concat([head, data, Buffer.alloc(4)]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr.set([8, 2, 0, 0, 0], 8);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", ihdr),
    chunk("IDAT", idat),
    chunk("IEND", Buffer.alloc(0)),
  ]);
}

function text(result: CallToolResult): string {
  return result.content.map((c) => (c.type === "text" ? c.text : `[${c.type}]`)).join("\n");
}

function refusalOf(result: CallToolResult): unknown {
  return result._meta?.["bothy/refusal"];
}

describe.skipIf(gvisor.missing !== undefined)(driverTitle(gvisor, "agent tools over MCP"), () => {
  let ts: TestServer;
  let documentId: string;
  const expected = salesCsv();
  const conversations: string[] = [];

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor", BOTHY_NETWORK: "off" });
    const res = await fetch(`${ts.url}/corpus?name=sales.csv`, {
      method: "POST",
      headers: { "content-type": "text/csv" },
      body: expected.csv,
    });
    expect(res.status).toBe(201);
    documentId = ((await res.json()) as { id: string }).id;
  });

  afterAll(async () => {
    for (const id of conversations) {
      const res = await api(ts.url, "DELETE", `/conversations/${id}`);
      expect(res.status).toBe(200);
    }
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  async function conversation(id: string): Promise<void> {
    const res = await api(ts.url, "POST", "/conversations", {
      conversation_id: id,
      template: "charts",
      memory_mib: 1024,
    });
    expect(res.status).toBe(201);
    conversations.push(id);
  }

  /** A tool call in a conversation and turn, named in _meta as a client would. */
  function caller(client: Client, conversationId: string) {
    return async (
      name: string,
      args: Record<string, unknown>,
      turn: string,
      onprogress?: (message: string) => void,
    ): Promise<CallToolResult> =>
      (await client.callTool(
        { name, arguments: args, _meta: { "bothy/conversation_id": conversationId, "bothy/turn_id": turn } },
        undefined,
        onprogress ? { onprogress: (p) => onprogress(p.message ?? ""), timeout: 120_000 } : { timeout: 120_000 },
      )) as CallToolResult;
  }

  /**
   * Upload → fetch → chart with matplotlib → view → export → send → the turn's attachment is the PNG.
   * `streamed` is the command output the client saw while it ran: over stdio the SDK's client
   * drops progress that reaches it in the same read as the result (its progress handler is gone
   * by the time the notification is handled), so there the log notifications are what count.
   */
  async function chartFlow(client: Client, conversationId: string, streamed?: string[]): Promise<void> {
    const call = caller(client, conversationId);
    const search = await call("rag_search", { query: "North widget revenue" }, "t1");
    expect(search.isError).toBeFalsy();
    expect(search._meta?.["bothy/untrusted"]).toEqual({ untrusted: true, source: "corpus" });
    const results = search._meta?.["results"] as Array<{ document_id: string; fragment: boolean }>;
    expect(results.length).toBeGreaterThan(0);
    expect(results.every((r) => r.fragment && r.document_id === documentId)).toBe(true);
    expect(text(search).match(/FRAGMENT: This is a fragment/g)?.length).toBe(results.length);
    expect(text(search)).toContain("computer_fetch_document");

    const fetched = await call("computer_fetch_document", { document_id: documentId }, "t1");
    expect(text(fetched)).toContain("/workspace/documents/sales.csv");
    expect(text(fetched)).toContain("120 data rows");

    expect((await call("computer_write_file", { path: "chart.py", content: CHART_PY }, "t1")).isError).toBeFalsy();
    const progress: string[] = [];
    const run = await call("computer_bash", { command: "python3 chart.py" }, "t1", (m) => progress.push(m));
    expect(text(run)).toContain("Exit code 0.");
    expect(run._meta?.["bothy/untrusted"]).toEqual({ untrusted: true, source: "sandbox" });
    expect(text(run)).toMatch(/<untrusted-[0-9a-f]{12}>[\s\S]*rendering chart[\s\S]*<\/untrusted-[0-9a-f]{12}>/);
    for (const region of REGIONS) expect(text(run)).toContain(`${region}=${expected.totals[region]}`);
    expect((streamed ?? progress).join("")).toContain("rendering chart");

    const view = await call("computer_view_file", { path: "revenue.png" }, "t1");
    const image = view.content.find((c) => c.type === "image");
    expect(image).toMatchObject({ type: "image", mimeType: "image/png" });

    const exported = await call("computer_export_file", { path: "/workspace/revenue.png" }, "t1");
    const exportId = exported._meta?.["export_id"] as string;
    expect(exportId).toMatch(/^exp_/);
    expect(exported._meta).toMatchObject({ name: "revenue.png", media_type: "image/png" });
    expect(text(exported)).toContain("send_file");
    expect((await call("send_file", { export_id: exportId }, "t1")).isError).toBeFalsy();

    const ended = await api(ts.url, "POST", `/conversations/${conversationId}/turns/t1/end`);
    expect(ended.json).toMatchObject({ state: "ended", warnings: [] });
    const turn = await api(ts.url, "GET", `/conversations/${conversationId}/turns/t1`);
    const attachments = turn.json["attachments"] as Array<{
      export_id: string;
      media_type: string;
      url: string;
      size: number;
    }>;
    expect(attachments).toHaveLength(1);
    expect(attachments[0]).toMatchObject({ export_id: exportId, media_type: "image/png" });

    const served = await fetch(`${ts.url}${attachments[0]?.url}`);
    expect(served.headers.get("content-type")).toBe("image/png");
    const bytes = Buffer.from(await served.arrayBuffer());
    const sandboxId = (await api(ts.url, "GET", `/conversations/${conversationId}`)).json["sandbox_id"] as string;
    const inSandbox = Buffer.from(
      await (await fetch(`${ts.url}/sandboxes/${sandboxId}/files?path=/workspace/revenue.png`)).arrayBuffer(),
    );
    expect(bytes.subarray(0, 8).toString("latin1")).toBe("\x89PNG\r\n\x1a\n");
    expect(bytes.equals(inSandbox)).toBe(true);
    expect(Buffer.from((image as { data: string }).data, "base64").equals(inSandbox)).toBe(true);
  }

  /** A turn that exported but sent nothing ends with a warning, in its result and the log. */
  async function unsentExportWarns(client: Client, conversationId: string): Promise<void> {
    const call = caller(client, conversationId);
    const exported = await call("computer_export_file", { path: "revenue.png", name: "unsent.png" }, "t2");
    expect(exported.isError).toBeFalsy();
    const ended = await api(ts.url, "POST", `/conversations/${conversationId}/turns/t2/end`);
    const warnings = ended.json["warnings"] as string[];
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toContain("sent none");
    expect(warnings[0]).toContain("send_file");
    expect(await readFile(ts.logPath, "utf8")).toMatch(/"event":"turn_exports_unsent".*"turn_id":"t2"/);
    // A tool call in an ended turn is refused.
    expect(refusalOf(await call("computer_bash", { command: "true" }, "t2"))).toBe("turn_ended");
  }

  /** Edits and writes: unread, partly read, and changed since the read are refused. */
  async function guardCases(client: Client, conversationId: string): Promise<void> {
    const call = caller(client, conversationId);
    await call("computer_bash", { command: "seq 1 50 | sed 's/^/line /' > notes.txt" }, "t3");

    const unread = await call(
      "computer_edit_file",
      { path: "notes.txt", old_string: "line 7\n", new_string: "line seven\n" },
      "t3",
    );
    expect(refusalOf(unread)).toBe("not_read");
    expect(text(unread)).toContain("computer_read_file");

    const part = await call("computer_read_file", { path: "notes.txt", start_line: 5, end_line: 9 }, "t3");
    expect(text(part)).toContain("     7\tline 7");
    expect(part._meta).toMatchObject({ whole: false, total_lines: 50 });
    const partial = await call("computer_write_file", { path: "notes.txt", content: "replaced\n" }, "t3");
    expect(refusalOf(partial)).toBe("partial_read");
    expect(text(partial)).toContain("Read the whole file");

    // An edit needs only a read in this turn, not a whole one.
    const edited = await call(
      "computer_edit_file",
      { path: "notes.txt", old_string: "line 7\n", new_string: "line seven\n" },
      "t3",
    );
    expect(edited.isError).toBeFalsy();
    const ambiguous = await call(
      "computer_edit_file",
      { path: "notes.txt", old_string: "line 1", new_string: "x" },
      "t3",
    );
    expect(refusalOf(ambiguous)).toBe("not_unique");

    const whole = await call("computer_read_file", { path: "notes.txt" }, "t3");
    expect(whole._meta).toMatchObject({ whole: true });
    await call("computer_bash", { command: "echo appended >> notes.txt" }, "t3");
    const stale = await call(
      "computer_edit_file",
      { path: "notes.txt", old_string: "line seven", new_string: "line 7" },
      "t3",
    );
    expect(refusalOf(stale)).toBe("changed_since_read");
    expect(text(stale)).toContain("Read it again");
    expect(refusalOf(await call("computer_write_file", { path: "notes.txt", content: "replaced\n" }, "t3"))).toBe(
      "changed_since_read",
    );

    // After a fresh whole read the write goes through; a read from another turn does not count.
    await call("computer_read_file", { path: "notes.txt" }, "t3");
    expect((await call("computer_write_file", { path: "notes.txt", content: "replaced\n" }, "t3")).isError).toBeFalsy();
    expect(
      refusalOf(
        await call("computer_edit_file", { path: "notes.txt", old_string: "replaced", new_string: "again" }, "t4"),
      ),
    ).toBe("not_read");
    const check = await call("computer_bash", { command: "cat notes.txt" }, "t4");
    expect(text(check)).toContain("replaced");
  }

  describe("over streamable HTTP", () => {
    let client: Client;

    beforeAll(async () => {
      await conversation("flow-http");
      client = new Client({ name: "bothy-test", version: "1.0.0" });
      await client.connect(new StreamableHTTPClientTransport(new URL(`${ts.url}/mcp`)));
    });

    afterAll(async () => {
      await client?.close();
    });

    it("lists the tools with their guidance, and the guidance prompt", async () => {
      const { tools } = await client.listTools();
      expect(tools.map((t) => t.name).sort()).toEqual([...TOOL_NAMES].sort());
      const desc = Object.fromEntries(tools.map((t) => [t.name, t.description ?? ""]));
      expect(desc["computer_edit_file"]).toContain("read in this turn");
      expect(desc["computer_view_file"]).toContain("check every chart");
      expect(desc["computer_export_file"]).toContain("send_file");
      expect(desc["rag_search"]).toContain("fragment");
      expect(desc["computer_bash"]).toContain("sqlite3");
      const prompt = await client.getPrompt({ name: "computer_guidance" });
      expect(JSON.stringify(prompt.messages)).toContain("Export, then send");
      expect(client.getInstructions()).toContain("Read before you edit");
    });

    it("charts a corpus CSV and sends the PNG: the turn's attachment is byte-identical to the sandbox file", async () => {
      await chartFlow(client, "flow-http");
    });

    it("ends a turn that exported but sent nothing with a warning, in its result and the log", async () => {
      await unsentExportWarns(client, "flow-http");
    });

    it("guards edits and writes: unread, partly read, and changed since the read are refused", async () => {
      await guardCases(client, "flow-http");
    });

    it("shows a large image as a downscaled copy the model can take in", { timeout: 60_000 }, async () => {
      const call = caller(client, "flow-http");
      const made = await call(
        "computer_bash",
        {
          command:
            "python3 -c \"import os; from PIL import Image; Image.frombytes('RGB', (2400, 1800), os.urandom(2400 * 1800 * 3)).save('noise.png')\" && stat -c %s noise.png",
        },
        "t7",
      );
      expect(text(made)).toContain("Exit code 0.");
      const view = await call("computer_view_file", { path: "noise.png" }, "t7");
      expect(view.isError).toBeFalsy();
      const image = view.content.find((c) => c.type === "image") as
        { type: "image"; data: string; mimeType: string } | undefined;
      expect(image?.mimeType).toBe("image/jpeg");
      const jpeg = Buffer.from(image?.data ?? "", "base64");
      expect(jpeg.length).toBeLessThan(2 * 1024 * 1024);
      expect(text(view)).toMatch(
        /image\/png, \d+ bytes\. Shown shrunk: a 1568x1176 JPEG copy \(\d+ bytes\) of the 2400x1800 original\./,
      );
      expect(view._meta).toMatchObject({ media_type: "image/png", shown_as: "image/jpeg" });
      // Nothing of the copy is left in the sandbox.
      expect(text(await call("computer_bash", { command: "ls /tmp | grep -c bothy- || true" }, "t7"))).toMatch(/\n0\n/);
    });

    describe("on the seed template (no Pillow, no ImageMagick)", () => {
      const SEED = "view-seed";
      let sandboxId = "";

      beforeAll(async () => {
        const res = await api(ts.url, "POST", "/conversations", { conversation_id: SEED, template: "seed" });
        expect(res.status).toBe(201);
        conversations.push(SEED);
        const call = caller(client, SEED);
        expect(text(await call("computer_bash", { command: "command -v python3 convert || true" }, "t1"))).not.toMatch(
          /\/convert/,
        );
        sandboxId = (await api(ts.url, "GET", `/conversations/${SEED}`)).json["sandbox_id"] as string;
      });

      /** Puts `bytes` at `path` in the conversation's sandbox through the files API. */
      async function upload(path: string, bytes: Buffer): Promise<void> {
        const res = await fetch(`${ts.url}/sandboxes/${sandboxId}/files?path=${encodeURIComponent(path)}`, {
          method: "PUT",
          headers: { "content-type": "application/octet-stream" },
          body: new Uint8Array(bytes),
        });
        expect(res.status).toBe(200);
      }

      it("shrinks a large PNG with bothy's own downscaler and says so", { timeout: 120_000 }, async () => {
        const png = noisePng(2400, 600);
        expect(png.length).toBeGreaterThan(4 * 1024 * 1024);
        await upload("/workspace/wide.png", png);
        const view = await caller(client, SEED)("computer_view_file", { path: "wide.png" }, "t2");
        expect(view.isError).toBeFalsy();
        const image = view.content.find((c) => c.type === "image") as
          { type: "image"; data: string; mimeType: string } | undefined;
        expect(image?.mimeType).toBe("image/jpeg");
        const jpeg = Buffer.from(image?.data ?? "", "base64");
        expect(jpeg.length).toBeLessThanOrEqual(1024 * 1024);
        expect(jpeg.subarray(0, 3)).toEqual(Buffer.from([0xff, 0xd8, 0xff]));
        expect(text(view)).toContain(
          `/workspace/wide.png: image/png, ${png.length} bytes. Shown shrunk: a 1568x392 JPEG copy (${jpeg.length} bytes) of the 2400x600 original.`,
        );
        expect(view._meta).toMatchObject({
          media_type: "image/png",
          shown_as: "image/jpeg",
          shrink: { shrunk: true, width: 2400, height: 600 },
        });
        const left = await caller(client, SEED)("computer_bash", { command: "ls /tmp | grep -c bothy- || true" }, "t2");
        expect(text(left)).toMatch(/\n0\n/);
      });

      it("says why an image too large to decode could not be shrunk", { timeout: 120_000 }, async () => {
        const call = caller(client, SEED);
        // Over 1 MiB, so the tool tries to shrink it; its header claims 2.5 billion pixels.
        await upload("/workspace/huge.png", pngWithHeader(50_000, 50_000, randomBytes(1536 * 1024)));
        const view = await call("computer_view_file", { path: "huge.png" }, "t3");
        expect(view.isError).toBeFalsy();
        expect(text(view)).toMatch(
          /could not be shrunk because it is 50000x50000 px \(2500\.0 million pixels\), more than the [\d.]+ million a sandbox with 512 MiB of memory can decode safely; shown as it is\./,
        );
        expect(view._meta).toMatchObject({ shrink: { shrunk: false, reason: "too_many_pixels" } });
        expect(view._meta?.["shown_as"]).toBeUndefined();

        // Over the viewing limit as well: refused, with the same reason.
        await upload("/workspace/huger.png", pngWithHeader(50_000, 50_000, randomBytes(11 * 1024 * 1024)));
        const refused = await call("computer_view_file", { path: "huger.png" }, "t3");
        expect(refusalOf(refused)).toBe("too_large");
        expect(text(refused)).toContain("could not be shrunk because it is 50000x50000 px");
      });
    });

    it("cuts long output from the middle with a notice, and starts background commands at once", async () => {
      const call = caller(client, "flow-http");
      const long = await call("computer_bash", { command: "seq 1 100000" }, "t5");
      const out = text(long);
      expect(out).toContain("Exit code 0.");
      expect(out).toMatch(/\n1\n2\n3\n/);
      expect(out).toContain("\n100000\n");
      expect(out).toMatch(/characters omitted from the middle of the output/);
      expect(out).not.toContain("\n50000\n");

      // A command past its timeout is a result with what it printed, not a failed call.
      const late = await call("computer_bash", { command: "echo started; sleep 30", timeout_s: 1 }, "t5");
      expect(late.isError).toBeFalsy();
      expect(text(late)).toContain("Timed out after 1 s and was killed.");
      expect(text(late)).toContain("started");
      expect(late._meta?.["command_id"]).toMatch(/^cmd_/);

      const ended: Array<Record<string, unknown>> = [];
      client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
        const data = n.params.data as Record<string, unknown>;
        if (data["event"] === "command_exited") ended.push(data);
      });
      const t0 = Date.now();
      const bg = await call(
        "computer_bash",
        { command: "sleep 2; echo done > bg.txt; exit 3", background: true },
        "t5",
      );
      expect(Date.now() - t0).toBeLessThan(2000);
      expect(bg._meta?.["command_id"]).toMatch(/^cmd_/);
      // Its end is reported on the session later, with its exit code.
      for (let i = 0; i < 100 && ended.length === 0; i++) await new Promise((r) => setTimeout(r, 100));
      expect(ended).toEqual([
        {
          event: "command_exited",
          conversation_id: "flow-http",
          command_id: bg._meta?.["command_id"],
          exit_code: 3,
          signal: null,
        },
      ]);
      expect(text(await call("computer_bash", { command: "cat bg.txt" }, "t5"))).toContain("done");
    });

    it(
      "checkpoints the computer and restores it: the files as then, in a new sandbox, the old one deleted; no other conversation can restore it",
      { timeout: 120_000 },
      async () => {
        const call = caller(client, "flow-http");
        await call("computer_bash", { command: "echo before > ck.txt" }, "t6");
        const taken = await call("computer_checkpoint", { label: "before the change" }, "t6");
        expect(taken.isError, text(taken)).toBeFalsy();
        const checkpointId = taken._meta?.["checkpoint_id"] as string;
        expect(checkpointId).toMatch(/^snap_/);
        expect(text(taken)).toContain("computer_restore");
        await call("computer_bash", { command: "echo after > ck.txt && echo extra > extra.txt" }, "t6");

        // Another conversation (another user's agent, same tools key) names this checkpoint.
        await conversation("flow-ck-other");
        const theirs = await caller(client, "flow-ck-other")("computer_restore", { checkpoint_id: checkpointId }, "t1");
        expect(refusalOf(theirs)).toBe("unknown_checkpoint");
        expect((await api(ts.url, "GET", "/conversations/flow-ck-other")).json["sandbox_id"]).toBeNull();

        const old = (await api(ts.url, "GET", "/conversations/flow-http")).json["sandbox_id"] as string;
        const restored = await call("computer_restore", { checkpoint_id: checkpointId }, "t6");
        expect(restored.isError, text(restored)).toBeFalsy();
        const fresh = restored._meta?.["sandbox_id"] as string;
        expect(restored._meta).toMatchObject({ checkpoint_id: checkpointId, replaced: old });
        expect(fresh).not.toBe(old);
        expect((await api(ts.url, "GET", "/conversations/flow-http")).json["sandbox_id"]).toBe(fresh);
        expect(await waitDeleted(ts.url, old)).toBe("deleted");
        const seen = await call("computer_bash", { command: "cat ck.txt; test -e extra.txt || echo no-extra" }, "t6");
        expect(text(seen)).toMatch(/before\nno-extra/);
      },
    );
  });

  it("gives a session that names no conversation its own, deleted with the session", async () => {
    const transport = new StreamableHTTPClientTransport(new URL(`${ts.url}/mcp`));
    const client = new Client({ name: "bothy-test-session", version: "1.0.0" });
    await client.connect(transport);
    const sessionId = transport.sessionId ?? "";
    let sandboxId = "";
    try {
      // The default template (workspace) is not built in tests: name one for the session's conversation.
      expect(
        (await api(ts.url, "POST", "/conversations", { conversation_id: sessionId, template: "charts" })).status,
      ).toBe(201);
      const hello = (await client.callTool({
        name: "computer_bash",
        arguments: { command: "echo hello from $(hostname)" },
      })) as CallToolResult;
      expect(text(hello)).toContain("hello from");
      expect(hello._meta?.["bothy/conversation_id"]).toBe(sessionId);
      expect(hello._meta?.["bothy/turn_id"]).toMatch(/^turn_/);
      sandboxId = (await api(ts.url, "GET", `/conversations/${sessionId}`)).json["sandbox_id"] as string;
      expect((await api(ts.url, "GET", `/sandboxes/${sandboxId}`)).json["state"]).toBe("running");
    } finally {
      await transport.terminateSession();
      await client.close();
    }
    await expect
      .poll(async () => (await api(ts.url, "GET", `/conversations/${sessionId}`)).json["deleted_at"], {
        timeout: 15_000,
      })
      .not.toBeNull();
    // The delete answers once the sandbox is deleting; its teardown then ends in `deleted`.
    expect(await waitDeleted(ts.url, sandboxId)).toBe("deleted");
  });

  it(
    "takes CSV, text, Markdown and PDF (text extracted in a throwaway sandbox) into the corpus and refuses other types",
    { timeout: 120_000 },
    async () => {
      const png = await fetch(`${ts.url}/corpus?name=photo.png`, {
        method: "POST",
        headers: { "content-type": "image/png" },
        body: "\x89PNG",
      });
      expect(png.status).toBe(415);
      expect(((await png.json()) as { detail: string }).detail).toContain("application/pdf");
      const md = await fetch(`${ts.url}/corpus?name=notes.md`, {
        method: "POST",
        body: "# Notes\n\nRegional targets for the year.\n",
      });
      expect(md.status).toBe(201);
      const pdf = await fetch(`${ts.url}/corpus?name=report.pdf`, {
        method: "POST",
        headers: { "content-type": "application/pdf" },
        body: minimalPdf("Quarterly outlook: the Eastern depot doubles capacity"),
      });
      expect(pdf.status).toBe(201);
      const pdfDoc = (await pdf.json()) as { name: string; media_type: string; lines: number };
      expect(pdfDoc).toMatchObject({ name: "report.pdf", media_type: "application/pdf" });
      expect(pdfDoc.lines).toBeGreaterThan(0);
      const hits = await api(ts.url, "GET", "/corpus");
      expect(
        (hits.json["documents"] as Array<{ name: string; media_type: string }>).map((d) => `${d.name}:${d.media_type}`),
      ).toEqual(["sales.csv:text/csv", "notes.md:text/markdown", "report.pdf:application/pdf"]);
      // A PDF with no text in it is refused, and its extraction sandbox is gone either way.
      const broken = await fetch(`${ts.url}/corpus?name=broken.pdf`, {
        method: "POST",
        headers: { "content-type": "application/pdf" },
        body: "%PDF-1.7\n",
      });
      expect(broken.status).toBe(400);
      expect(((await broken.json()) as { detail: string }).detail).toMatch(/could not be extracted|no text/);
      await waitNoneDeleting(ts.url);
      const live = (
        (await api(ts.url, "GET", "/sandboxes")).json["sandboxes"] as Array<{ template: string; state: string }>
      ).filter((s) => s.template === "workspace" && s.state !== "deleted");
      expect(live).toEqual([]);
    },
  );

  describe("over stdio (bothy mcp)", () => {
    let client: Client;
    const logged: string[] = [];

    beforeAll(async () => {
      await conversation("flow-stdio");
      client = new Client({ name: "bothy-test-stdio", version: "1.0.0" });
      client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
        const data = n.params.data as { output?: unknown };
        if (n.params.logger === "computer_bash" && typeof data.output === "string") logged.push(data.output);
      });
      await client.connect(
        new StdioClientTransport({
          command: process.execPath,
          args: [BOTHY, "mcp", "--url", ts.url, "--conversation", "flow-stdio"],
          // The MCP SDK passes a child only a few variables of its own; the key goes explicitly.
          env: { ...getDefaultEnvironment(), BOTHY_API_KEY: ts.apiKey },
          stderr: "inherit",
        }),
      );
    });

    afterAll(async () => {
      await client?.close();
    });

    it("charts a corpus CSV and sends the PNG through the stdio relay", async () => {
      await chartFlow(client, "flow-stdio", logged);
    });

    it("warns at the end of a turn that exported but sent nothing", async () => {
      await unsentExportWarns(client, "flow-stdio");
    });

    it("guards edits and writes the same way", async () => {
      await guardCases(client, "flow-stdio");
    });

    it("brings the conversation's computer back from its disk when its sandbox died: same sandbox, files kept", async () => {
      const sandboxId = (await api(ts.url, "GET", "/conversations/flow-stdio")).json["sandbox_id"] as string;
      const call = caller(client, "flow-stdio");
      expect(text(await call("computer_bash", { command: "echo kept > kept.txt && sync" }, "t6"))).toContain(
        "Exit code 0.",
      );
      for (const entry of await readdir("/proc")) {
        if (!/^\d+$/.test(entry)) continue;
        const argv = await readFile(`/proc/${entry}/cmdline`, "utf8").catch(() => "");
        if (argv.includes(sandboxId) && /runsc/.test(argv)) process.kill(Number(entry), "SIGKILL");
      }
      for (let i = 0; i < 60 && (await api(ts.url, "GET", `/sandboxes/${sandboxId}`)).json["state"] !== "stopped"; i++)
        await new Promise((r) => setTimeout(r, 250));
      expect((await api(ts.url, "GET", `/sandboxes/${sandboxId}`)).json["state"]).toBe("stopped");

      const back = await call("computer_bash", { command: "ls revenue.png notes.txt && cat kept.txt" }, "t6");
      expect(text(back)).toContain("Exit code 0.");
      expect(text(back)).toContain("kept");
      expect(text(back)).not.toContain("previous sandbox was gone");
      expect((await api(ts.url, "GET", "/conversations/flow-stdio")).json["sandbox_id"]).toBe(sandboxId);
      expect((await api(ts.url, "GET", `/sandboxes/${sandboxId}`)).json["state"]).toBe("running");
    });
  });
});
