import { execFileSync } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  NotFoundError,
  Sandbox,
  TimeoutError,
  type ExecutionError,
  type OutputMessage,
  type Result,
} from "@e2b/code-interpreter";
import { pythonModuleMissing, useE2bEnv } from "./helpers/e2b-env.ts";
import { noLeaks } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

const PNG_MAGIC = "\x89PNG\r\n\x1a\n";

/**
 * The real `@e2b/code-interpreter` SDK (2.8, on e2b 2.51) against a real bothy (gVisor) and the
 * `code-interpreter` template, configured only through E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY.
 * One sandbox serves every case, as one notebook would: the kernel's state carries between them.
 */
describe("E2B code interpreter (@e2b/code-interpreter 2.8, gVisor)", () => {
  let ts: TestServer;
  let restoreEnv: () => void = () => undefined;
  let sbx: Sandbox | undefined;

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor" });
    restoreEnv = useE2bEnv(ts.url);
    // The SDK's own default template, code-interpreter-v1, names bothy's code-interpreter.
    sbx = await Sandbox.create({ timeoutMs: 600_000 });
  });

  afterAll(async () => {
    if (sbx) await sbx.kill();
    restoreEnv();
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  function sandbox(): Sandbox {
    if (!sbx) throw new Error("no sandbox: creating it failed");
    return sbx;
  }

  it("runs 1+1 and returns the text of the main result", async () => {
    const execution = await sandbox().runCode("1+1");
    expect(execution.error).toBeUndefined();
    expect(execution.text).toBe("2");
    expect(execution.results).toHaveLength(1);
    expect(execution.results[0]?.isMainResult).toBe(true);
    expect(execution.executionCount).toBeGreaterThan(0);
  });

  it("serves the execute server on the guest's loopback only, where the port proxy connects", async () => {
    // A peer on the sandbox's network would otherwise run code in it: nothing may listen on 49999 but 127.0.0.1.
    expect((await sandbox().runCode("1")).text).toBe("1"); // the server starts on first use
    const listening = await sandbox().commands.run(
      "awk '$4 == \"0A\" && $2 ~ /:C34F$/ { print $2 }' /proc/net/tcp /proc/net/tcp6",
    );
    expect(listening.stdout.trim().split("\n")).toEqual(["0100007F:C34F"]);
  });

  it("streams stdout and stderr to the callbacks and into the logs", async () => {
    const out: OutputMessage[] = [];
    const err: OutputMessage[] = [];
    const execution = await sandbox().runCode("import sys\nprint('hello out')\nprint('hello err', file=sys.stderr)", {
      onStdout: (m) => void out.push(m),
      onStderr: (m) => void err.push(m),
    });
    expect(out.map((m) => m.line).join("")).toBe("hello out\n");
    expect(err.map((m) => m.line).join("")).toBe("hello err\n");
    expect(err.every((m) => m.error)).toBe(true);
    expect(execution.logs.stdout.join("")).toBe("hello out\n");
    expect(execution.logs.stderr.join("")).toBe("hello err\n");
    expect(execution.results).toEqual([]);
  });

  it("returns a Python exception as the SDK's ExecutionError", async () => {
    const errors: ExecutionError[] = [];
    const execution = await sandbox().runCode("1/0", { onError: (e) => void errors.push(e) });
    expect(execution.error?.name).toBe("ZeroDivisionError");
    expect(execution.error?.value).toBe("division by zero");
    expect(execution.error?.traceback).toContain("ZeroDivisionError");
    expect(errors).toHaveLength(1);
  });

  it("keeps state between runs", async () => {
    await sandbox().runCode("x = 1");
    expect((await sandbox().runCode("x + 1")).text).toBe("2");
  });

  it("passes envs to one run only", async () => {
    const code = "import os; os.environ.get('BOTHY_CI_VAR', 'unset')";
    expect((await sandbox().runCode(code, { envs: { BOTHY_CI_VAR: "set" } })).text).toBe("'set'");
    expect((await sandbox().runCode(code)).text).toBe("'unset'");
  });

  it("returns a matplotlib chart as a PNG result", async () => {
    const results: Result[] = [];
    const execution = await sandbox().runCode(
      "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()",
      { onResult: (r) => void results.push(r) },
    );
    expect(execution.error).toBeUndefined();
    const chart = execution.results.find((r) => r.png !== undefined);
    expect(chart?.isMainResult).toBe(false);
    expect(chart?.formats()).toContain("png");
    expect(
      Buffer.from(chart?.png ?? "", "base64")
        .subarray(0, 8)
        .toString("latin1"),
    ).toBe(PNG_MAGIC);
    expect(chart?.text).toMatch(/^<Figure size/);
    expect(results).toHaveLength(execution.results.length);
  });

  it("returns a pandas DataFrame with its HTML and text forms", async () => {
    const execution = await sandbox().runCode("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})");
    const main = execution.results.find((r) => r.isMainResult);
    expect(main?.html).toContain("<table");
    expect(main?.text).toMatch(/a\s+b/);
    expect(main?.formats()).toContain("html");
  });

  it("creates, lists, runs in, restarts and removes a context", async () => {
    const ctx = await sandbox().createCodeContext({ cwd: "/tmp" });
    expect(ctx).toMatchObject({ language: "python", cwd: "/tmp" });
    expect((await sandbox().listCodeContexts()).map((c) => c.id)).toContain(ctx.id);
    expect((await sandbox().runCode("import os; os.getcwd()", { context: ctx })).text).toBe("'/tmp'");
    // Its own kernel: the default context's x is not there.
    await sandbox().runCode("y = 41", { context: ctx });
    expect((await sandbox().runCode("y + 1", { context: ctx })).text).toBe("42");
    expect((await sandbox().runCode("'x' in dir()", { context: ctx })).text).toBe("False");
    await sandbox().restartCodeContext(ctx);
    expect((await sandbox().runCode("'y' in dir()", { context: ctx })).text).toBe("False");
    await sandbox().removeCodeContext(ctx);
    expect((await sandbox().listCodeContexts()).map((c) => c.id)).not.toContain(ctx.id);
    await expect(sandbox().runCode("1", { context: ctx })).rejects.toBeInstanceOf(NotFoundError);
    await expect(sandbox().createCodeContext({ cwd: "/no/such/dir" })).rejects.toThrow(/400/);
  });

  it("a run that outlives its timeout raises TimeoutError and is interrupted in the kernel", async () => {
    const err = await sandbox()
      .runCode("import time\ntime.sleep(600)", { timeoutMs: 2_000 })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TimeoutError);
    // The kernel is free again only because the abandoned cell was interrupted.
    expect((await sandbox().runCode("6 * 7")).text).toBe("42");
  });

  it("wakes a sleeping sandbox and starts the server again", async () => {
    // gVisor sleeps by stopping every process (disk kept): the kernel's state is gone, the server
    // is started again by the first request, as on a sandbox's first use.
    await ts.server.manager.sleep(sandbox().sandboxId);
    expect((await sandbox().getInfo()).state).toBe("paused");
    const execution = await sandbox().runCode("'x' in dir(), 6 * 7");
    expect(execution.text).toBe("(False, 42)");
  });
});

const missing = pythonModuleMissing(
  "e2b_code_interpreter",
  "the e2b-code-interpreter Python package (PyPI is not reachable from this machine)",
);
describe.skipIf(missing !== undefined)(
  `E2B code interpreter (Python SDK, gVisor)${missing ? ` [skipped: needs ${missing}]` : ""}`,
  () => {
    let ts: TestServer;
    beforeAll(async () => {
      ts = await startTestServer({ BOTHY_DRIVER: "gvisor" });
    });
    afterAll(async () => {
      expect(await ts?.stop()).toEqual(noLeaks());
    });

    it("runs 1+1 through the Python SDK", () => {
      // The Python SDK reads the same variables; the helper sets them (and, where keys exist, the key).
      const restore = useE2bEnv(ts.url);
      const env: NodeJS.ProcessEnv = { PATH: process.env["PATH"], HOME: process.env["HOME"] };
      for (const [name, value] of Object.entries(process.env)) if (name.startsWith("E2B_")) env[name] = value;
      restore();
      const out = execFileSync(
        "python3",
        ["-c", "from e2b_code_interpreter import Sandbox\nwith Sandbox() as s: print(s.run_code('1+1').text)"],
        { encoding: "utf8", env },
      );
      expect(out.trim()).toBe("2");
    });
  },
);
