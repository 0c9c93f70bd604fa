import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { noLeaks } from "../../server/test/helpers/host-state.ts";
import { startTestServer, type TestServer } from "../../server/test/helpers/test-server.ts";
import { Sandbox, SandboxError } from "../src/index.ts";

const BOTHY = fileURLToPath(new URL("../../cli/bin/bothy.js", import.meta.url));
const SERVER = `node -e "require('http').createServer((q, s) => s.end('hi from ' + q.url)).listen(8000)"`;

function bothy(args: string[], baseUrl: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BOTHY, ...args], { env: { ...process.env, BOTHY_URL: baseUrl } });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (c: Buffer) => (stdout += c.toString()));
    child.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}

describe("SDK and CLI: ports as URLs [gvisor]", () => {
  let ts: TestServer;
  let sandbox: Sandbox;

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor" });
    sandbox = await Sandbox.create({ baseUrl: ts.url, vcpu: 1, memoryMib: 512, timeoutS: 600 });
  });

  afterAll(async () => {
    try {
      if (sandbox) await sandbox.kill();
    } finally {
      expect(await ts?.stop()).toEqual(noLeaks());
    }
  });

  it("sandbox.ports.list() and ports.url(): a server inside answers at its URL", async () => {
    await sandbox.commands.run(SERVER, { background: true });
    let ports = await sandbox.ports.list();
    for (let i = 0; i < 300 && !ports.some((p) => p.port === 8000); i++) {
      await new Promise((r) => setTimeout(r, 100));
      ports = await sandbox.ports.list();
    }
    expect(ports).toContainEqual({ port: 8000, address: expect.stringMatching(/^(0\.0\.0\.0|::)$/) as string });
    const url = sandbox.ports.url(8000, "/page?q=1");
    expect(url).toBe(`${ts.url}/sandboxes/${sandbox.sandboxId}/ports/8000/page?q=1`);
    expect(await (await fetch(url)).text()).toBe("hi from /page?q=1");
    expect(sandbox.getHost(8000)).toBe(
      `${ts.url.replace(/^http:\/\//, "")}/sandboxes/${sandbox.sandboxId}/ports/8000/`,
    );
    expect(() => sandbox.ports.url(70000)).toThrow(RangeError);
  });

  it("a port nobody listens on is a SandboxError with code port_not_listening", async () => {
    const res = await fetch(sandbox.ports.url(9));
    expect(res.status).toBe(502);
    expect(((await res.json()) as { code: string }).code).toBe("port_not_listening");
    await expect(Sandbox.connect("sbx_aaaaaaaaaaaaaaaaaaaa", { baseUrl: ts.url })).rejects.toBeInstanceOf(SandboxError);
  });

  it("bothy port ID PORT prints the URL; bothy port ID lists the ports", async () => {
    const url = await bothy(["port", sandbox.sandboxId, "8000"], ts.url);
    expect(url).toMatchObject({ code: 0, stderr: "" });
    expect(url.stdout).toBe(`${ts.url}/sandboxes/${sandbox.sandboxId}/ports/8000/\n`);
    const list = await bothy(["port", sandbox.sandboxId], ts.url);
    expect(list.stdout).toContain(`8000\t`);
    const bad = await bothy(["port", sandbox.sandboxId, "http"], ts.url);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("not a TCP port");
  });
});
