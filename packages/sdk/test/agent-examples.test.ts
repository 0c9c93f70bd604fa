/**
 * The agent examples (examples/ts-agent, examples/python-agent) as a user runs them: each as its
 * own process, with its scripted model (no network but the server's loopback), against a real
 * server and one gVisor sandbox they share. Each prints its transcript as JSON; the tools' results
 * in it are checked here.
 */
import { execFile } from "node:child_process";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { PNG } from "pngjs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Sandbox } from "@bothy/sdk";
import { driverTitle, testDriver } from "../../server/test/helpers/drivers.ts";
import { noLeaks } from "../../server/test/helpers/host-state.ts";
import { startTestServer, type TestServer } from "../../server/test/helpers/test-server.ts";

const run = promisify(execFile);
const REPO = fileURLToPath(new URL("../../..", import.meta.url));
const PYTHON = "/usr/bin/python3";
const RUN_DEADLINE_MS = 120_000;
const gvisor = testDriver("gvisor");

interface Transcript {
  final: string;
  messages: Array<
    | { role: "user"; content: string }
    | { role: "assistant"; call: unknown }
    | { role: "tool"; tool: string; result: Record<string, unknown> }
  >;
}

/** The tool results of a transcript, in order. */
function results(t: Transcript): Array<Record<string, unknown>> {
  return t.messages.flatMap((m) => (m.role === "tool" ? [m.result] : []));
}

/** What both examples' demo script must have got from the sandbox. */
function checkDemo(t: Transcript): void {
  const [version, written, drawn, output, image, failing] = results(t);
  expect(version).toMatchObject({ ok: true, exit_code: 0 });
  expect(String(version?.["stdout"])).toMatch(/^v\d+\./);
  expect(written).toMatchObject({ ok: true });
  expect(drawn).toMatchObject({ ok: true, exit_code: 0, stdout: "" });
  expect(output).toEqual({ ok: true, content: "drew 4x3\n" });
  expect(image).toMatchObject({ ok: true, media_type: "image/png" });
  const png = PNG.sync.read(Buffer.from(String(image?.["base64"]), "base64"));
  expect([png.width, png.height]).toEqual([4, 3]);
  expect([...png.data.subarray(0, 3)]).toEqual([255, 128, 0]);
  // A command that fails is a result the model reads, not the end of the loop.
  expect(failing).toMatchObject({ ok: true, exit_code: 3 });
  expect(t.final).toBe("ran 6 tool calls, 0 failed");
}

describe.skipIf(gvisor.missing !== undefined)(driverTitle(gvisor, "agent examples with a scripted model"), () => {
  let ts: TestServer;
  let sandbox: Sandbox;
  let env: NodeJS.ProcessEnv;

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor" });
    sandbox = await Sandbox.create({ baseUrl: ts.url, template: "seed" });
    env = { ...process.env, BOTHY_URL: ts.url, BOTHY_API_KEY: ts.apiKey, BOTHY_SANDBOX_ID: sandbox.sandboxId };
  });

  afterAll(async () => {
    await sandbox?.kill().catch(() => undefined);
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  it("the TypeScript agent (@bothy/sdk) runs its tools in the sandbox", async () => {
    const { stdout } = await run(process.execPath, ["--import", "tsx", join(REPO, "examples/ts-agent/main.ts")], {
      env,
      cwd: REPO,
      timeout: RUN_DEADLINE_MS,
    });
    checkDemo(JSON.parse(stdout) as Transcript);
    // It used the sandbox it was given: the files are there.
    expect(await sandbox.files.exists("/workspace/agent/dot.png")).toBe(true);
  });

  it("the Python agent (the repository's python/ SDK) runs its tools in the sandbox", async () => {
    const { stdout } = await run(PYTHON, [join(REPO, "examples/python-agent/agent.py")], {
      env: { ...env, PYTHONPATH: join(REPO, "python/src") },
      cwd: REPO,
      timeout: RUN_DEADLINE_MS,
    });
    checkDemo(JSON.parse(stdout) as Transcript);
    expect(await sandbox.files.exists("/workspace/pyagent/dot.png")).toBe(true);
  });
});
