/**
 * The `workspace` template, the computer conversations get by default: every tool the agent
 * guidance promises is there and works, in a real gVisor sandbox.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { noLeaks } from "../../server/test/helpers/host-state.ts";
import { api, createSandbox, runCommand } from "../../server/test/helpers/client.ts";
import { startTestServer, type TestServer } from "../../server/test/helpers/test-server.ts";

/** One line per tool: what it prints when it works. */
const CHECKS = [
  "python3 -c 'import pandas, numpy, matplotlib, openpyxl; print(\"python-data ok\")'",
  "pandoc --version | head -1",
  "soffice --version | head -1",
  "pdftotext -v 2>&1 | head -1",
  "qpdf --version | head -1",
  "gs --version",
  "tesseract --version 2>&1 | head -1",
  "ffmpeg -hide_banner -version | head -1",
  "convert -version | head -1",
  "vips --version",
  "rg --version | head -1",
  "jq --version",
  "sqlite3 --version | cut -d' ' -f1",
  "git --version",
  "curl --version | head -1",
  "sudo -n whoami",
  "pwd",
];

describe("the workspace template", () => {
  let ts: TestServer;
  let id = "";

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor" });
    id = await createSandbox(ts.url, { template: "workspace", vcpu: 2, memoryMib: 2048 });
  });

  afterAll(async () => {
    if (id) await api(ts.url, "DELETE", `/sandboxes/${id}`);
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  it(
    "has the data, document, media and everyday tools, sudo, and /workspace as the working directory",
    { timeout: 120_000 },
    async () => {
      const r = await runCommand(ts.wsUrl, id, {
        cmd: CHECKS.map((c) => `(${c}) || echo "FAILED: ${c.replaceAll('"', "'")}"`).join("; "),
      });
      expect(r.stdout).not.toContain("FAILED");
      const lines = r.stdout.trim().split("\n");
      expect(lines).toHaveLength(CHECKS.length);
      expect(lines[0]).toBe("python-data ok");
      expect(lines).toContain("root");
      expect(lines.at(-1)).toBe("/workspace");
    },
  );

  it(
    "converts a document end to end: Markdown → DOCX (pandoc) → PDF (LibreOffice) → text (poppler)",
    { timeout: 180_000 },
    async () => {
      const r = await runCommand(ts.wsUrl, id, {
        cmd: "printf '# Quarterly notes\\n\\nRevenue grew in the North.\\n' > notes.md && pandoc notes.md -o notes.docx && soffice --headless --convert-to pdf notes.docx > /dev/null 2>&1 && pdftotext notes.pdf - && qpdf --check notes.pdf",
        timeout_s: 150,
      });
      expect(r.exit?.exit_code, r.stderr).toBe(0);
      expect(r.stdout).toContain("Quarterly notes");
      expect(r.stdout).toContain("Revenue grew in the North.");
      expect(r.stdout).toMatch(/no syntax or stream encoding errors/i);
    },
  );
});
