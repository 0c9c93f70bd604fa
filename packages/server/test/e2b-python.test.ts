import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { pythonModuleMissing } from "./helpers/e2b-env.ts";
import { useTestServer } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

const pexec = promisify(execFile);
const SCRIPT = fileURLToPath(new URL("./fixtures/e2b_python_check.py", import.meta.url));

const missing = pythonModuleMissing(
  "e2b",
  "the e2b Python package (pip install e2b; PyPI is not reachable from this machine)",
);
const title = `E2B compatibility (e2b Python SDK, gVisor)${missing ? ` [skipped: needs ${missing}]` : ""}`;

/** The Python SDK reads the same three variables as the JavaScript one; nothing else is set. */
describe.skipIf(missing !== undefined)(title, () => {
  let ts: TestServer;
  useTestServer({ BOTHY_DRIVER: "gvisor" }, (s) => (ts = s));

  it("creates, runs (exit codes too), writes, reads, lists, reads info and kills", async () => {
    const env: NodeJS.ProcessEnv = {
      PATH: process.env["PATH"],
      HOME: process.env["HOME"],
      E2B_API_URL: `${ts.url}/e2b`,
      E2B_SANDBOX_URL: `${ts.url}/e2b/envd`,
      E2B_API_KEY: ts.apiKey,
    };
    const { stdout } = await pexec("python3", [SCRIPT], { env, timeout: 110_000 });
    expect(JSON.parse(stdout)).toMatchObject({
      sandbox_id: expect.stringMatching(/^sbx_/),
      run: { stdout: "out py\n", stderr: "err\n", exit_code: 0 },
      exit: 3,
      read: "hello from python",
      listed: ["hello.txt"],
      exists: false,
      metadata: { suite: "python" },
      killed: true,
    });
  });
});
