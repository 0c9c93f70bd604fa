import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { noLeaks } from "../../server/test/helpers/host-state.ts";
import { testDrivers } from "../../server/test/helpers/drivers.ts";
import { startTestServer, type TestServer } from "../../server/test/helpers/test-server.ts";

const qemuDriver = testDrivers().find((d) => d.name === "qemu");
const qemuMissing = qemuDriver ? qemuDriver.missing : "BOTHY_TEST_DRIVERS to include qemu";

const BOTHY = fileURLToPath(new URL("../bin/bothy.js", import.meta.url));

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

describe("bothy CLI against a real server [gvisor]", () => {
  let ts: TestServer;
  let dir: string;
  const created: string[] = [];

  /** Runs the bothy binary as a user would, with BOTHY_URL pointing at the test server. */
  function bothy(args: string[], options: { input?: string; env?: Record<string, string> } = {}): Promise<Run> {
    return new Promise((resolve, reject) => {
      const child = spawn(process.execPath, [BOTHY, ...args], {
        env: { ...process.env, BOTHY_URL: ts.url, ...options.env },
        stdio: ["pipe", "pipe", "pipe"],
      });
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      child.stdout.on("data", (c: Buffer) => out.push(c));
      child.stderr.on("data", (c: Buffer) => err.push(c));
      child.on("error", reject);
      child.on("close", (code) =>
        resolve({ code, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString() }),
      );
      child.stdin.end(options.input ?? "");
    });
  }

  async function newSandbox(): Promise<string> {
    const r = await bothy(["create", "--timeout", "600"]);
    expect(r.stderr).toBe("");
    const id = r.stdout.trim();
    expect(id).toMatch(/^sbx_[a-z2-7]{20}$/);
    created.push(id);
    return id;
  }

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor" });
    dir = await mkdtemp(join(tmpdir(), "bothy-cli-"));
  });

  afterAll(async () => {
    try {
      for (const id of created) await fetch(`${ts.url}/sandboxes/${id}`, { method: "DELETE" });
      await rm(dir, { recursive: true, force: true });
    } finally {
      expect(await ts?.stop()).toEqual(noLeaks());
    }
  });

  it("create, ls, info, exec, rm: text and --json", async () => {
    const created = await bothy([
      "create",
      "--json",
      "--vcpu",
      "1",
      "--memory",
      "512",
      "--meta",
      "team=agents",
      "--meta",
      "run=7",
    ]);
    const info = JSON.parse(created.stdout) as { sandbox_id: string; state: string; metadata: Record<string, string> };
    const id = info.sandbox_id;
    try {
      expect(info.state).toBe("running");
      expect(info.metadata).toEqual({ team: "agents", run: "7" });
      const ls = await bothy(["ls"]);
      expect(ls.stdout).toMatch(/^ID\s+STATE\s+TEMPLATE/);
      expect(ls.stdout).toContain(`${id}  running`);
      const lsJson = JSON.parse((await bothy(["ls", "--json"])).stdout) as { sandboxes: Array<{ sandbox_id: string }> };
      expect(lsJson.sandboxes.map((s) => s.sandbox_id)).toContain(id);
      expect((await bothy(["info", id])).stdout).toMatch(new RegExp(`^id:\\s+${id}\\nstate:\\s+running\\n`));

      const exec = await bothy(["exec", id, "--", "echo out; echo err >&2; exit 7"]);
      expect(exec).toEqual({ code: 7, stdout: "out\n", stderr: "err\n" });
      const words = await bothy(["exec", id, "-e", "X=a b", "--cwd", "/tmp", "--", "printf", "%s|", "$X", "it's"]);
      expect(words.stdout).toBe("$X|it's|");
      const piped = await bothy(["exec", "-i", id, "--", "tr a-z A-Z"], { input: "shout\n" });
      expect(piped.stdout).toBe("SHOUT\n");
      expect((await bothy(["exec", id, "--", "kill -TERM $$"])).code).toBe(128 + 15);
    } finally {
      const removed = await bothy(["rm", "--wait", id]);
      expect(removed).toMatchObject({ code: 0, stdout: `${id}\n` });
    }
    expect((await bothy(["ls", "-q"])).stdout).not.toContain(id);
    expect((await bothy(["info", "--json", id])).stdout).toContain('"state": "deleted"');
  });

  it.skipIf(qemuMissing !== undefined)(
    "pause and resume a QEMU sandbox (gVisor cannot pause)",
    { timeout: 300_000 },
    async () => {
      const id = (await bothy(["create", "--driver", "qemu"])).stdout.trim();
      try {
        expect((await bothy(["exec", id, "--", "echo kept > /workspace/note"])).code).toBe(0);
        expect(await bothy(["pause", id])).toMatchObject({ code: 0 });
        expect((await bothy(["info", "--json", id])).stdout).toContain('"state": "paused"');
        expect(await bothy(["resume", id])).toMatchObject({ code: 0 });
        expect((await bothy(["exec", id, "--", "cat /workspace/note"])).stdout).toBe("kept\n");
      } finally {
        await bothy(["rm", id]);
      }
    },
  );

  it("policy set (from stdin), show and clear the tenant's default", async () => {
    const set = await bothy(["policy", "set", "-"], { input: JSON.stringify({ tools: { send_file: "ask" } }) });
    expect(set.stderr).toBe("");
    expect(JSON.parse(set.stdout)).toEqual({ tenant: "default", policy: { tools: { send_file: "ask" } } });
    expect(JSON.parse((await bothy(["policy", "show"])).stdout).policy).toEqual({ tools: { send_file: "ask" } });
    const bad = await bothy(["policy", "set", "-"], { input: JSON.stringify({ tools: { x: "maybe" } }) });
    expect(bad.code).toBe(1);
    expect(bad.stderr).toContain("invalid_request");
    expect(JSON.parse((await bothy(["policy", "clear"])).stdout).policy).toBeNull();
  });

  it("reports API errors with exit status 1 and usage errors with 2", async () => {
    const missing = await bothy(["exec", "sbx_aaaaaaaaaaaaaaaaaaaa", "--", "true"]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/^bothy: No sandbox sbx_a+; .*\(sandbox_not_found\)\n$/);
    // Networking is off on this test server: the policy reaches it and is refused, not dropped.
    const noNet = await bothy(["create", "--no-internet", "--allow-out", "203.0.113.10"]);
    expect(noNet.code).toBe(1);
    expect(noNet.stderr).toMatch(/internet and allow_out.*\(not_supported\)/);
    expect((await bothy(["create", "--meta", "novalue"])).code).toBe(2);
    const usage = await bothy(["exec", "sbx_aaaaaaaaaaaaaaaaaaaa"]);
    expect(usage.code).toBe(2);
    expect(usage.stderr).toContain("usage: bothy exec ID");
    expect((await bothy(["rm", "sbx_aaaaaaaaaaaaaaaaaaaa"])).code).toBe(1);
    const down = await bothy(["ls"], { env: { BOTHY_URL: "http://127.0.0.1:9" } });
    expect(down.code).toBe(1);
    expect(down.stderr).toContain("Cannot reach bothy at http://127.0.0.1:9");
  });

  it("secrets put reads the value from stdin, ls and rm never show it", async () => {
    const value = "ghp_cli_secret_value_123";
    const put = await bothy(
      [
        "secrets",
        "put",
        "github",
        "--host",
        "api.github.com",
        "--header",
        "Authorization",
        "--format",
        "Bearer {value}",
      ],
      { input: `${value}\n` },
    );
    expect(put).toMatchObject({ code: 0, stdout: "github\n", stderr: "" });
    const ls = await bothy(["secrets", "ls", "--json"]);
    expect(JSON.parse(ls.stdout)).toMatchObject({
      secrets: [
        { name: "github", hosts: ["api.github.com"], inject: { header: "Authorization", format: "Bearer {value}" } },
      ],
    });
    expect((await bothy(["secrets", "ls"])).stdout).toContain("Authorization: Bearer {value}");
    expect(ls.stdout + put.stdout).not.toContain(value);
    expect((await bothy(["secrets", "put", "github", "--host", "api.github.com"], { input: "" })).code).toBe(2);
    expect((await bothy(["secrets", "put", "github"], { input: value })).code).toBe(2);
    expect(await bothy(["secrets", "rm", "github"])).toMatchObject({ code: 0, stdout: "github\n" });
    const gone = await bothy(["secrets", "rm", "github"]);
    expect(gone.code).toBe(1);
    expect(gone.stderr).toContain("(secret_not_found)");
  });

  it("tenants rm: refused while the tenant holds a key, naming it; removed once it holds nothing", async () => {
    expect((await bothy(["tenants", "create", "cli-gone"])).code).toBe(0);
    const made = await bothy(["keys", "create", "--tenant", "cli-gone", "--name", "k", "--json"]);
    const keyId = (JSON.parse(made.stdout) as { key_id: string }).key_id;
    const held = await bothy(["tenants", "rm", "cli-gone"]);
    expect(held.code).toBe(1);
    expect(held.stderr).toContain("still has 1 API key; revoke its keys");
    expect(held.stderr).toContain("(tenant_in_use)");
    expect((await bothy(["keys", "revoke", keyId])).code).toBe(0);
    expect(await bothy(["tenants", "rm", "cli-gone"])).toMatchObject({ code: 0, stdout: "cli-gone\n", stderr: "" });
    const gone = await bothy(["tenants", "rm", "cli-gone"]);
    expect(gone.code).toBe(1);
    expect(gone.stderr).toContain("(tenant_not_found)");
    expect((await bothy(["tenants", "rm"])).code).toBe(2);
  });

  it("cp copies files in and out, keeping the bytes; logs shows events and command output", async () => {
    const id = await newSandbox();
    const local = join(dir, "blob.bin");
    const bytes = randomBytes(3 * 1024 * 1024 + 17);
    await writeFile(local, bytes);
    const up = await bothy(["cp", "--json", local, `${id}:/workspace/`]);
    expect(up.code).toBe(0);
    expect(JSON.parse(up.stdout)).toMatchObject({ path: "/workspace/blob.bin", size: bytes.length });
    expect((await bothy(["exec", id, "--", "sha256sum blob.bin | cut -c1-64"])).stdout.trim()).toBe(
      (JSON.parse(up.stdout) as { sha256: string }).sha256,
    );
    const down = await bothy(["cp", `${id}:blob.bin`, join(dir, "back.bin")]);
    expect(down).toMatchObject({ code: 0, stderr: "" });
    expect((await readFile(join(dir, "back.bin"))).equals(bytes)).toBe(true);
    expect((await bothy(["cp", "-", `${id}:note.txt`], { input: "from stdin" })).code).toBe(0);
    expect((await bothy(["cp", `${id}:note.txt`, "-"])).stdout).toBe("from stdin");

    const bg = await bothy(["exec", "-d", id, "--", "echo first; sleep 1; echo second; exit 3"]);
    const commandId = bg.stdout.trim();
    expect(commandId).toMatch(/^cmd_/);
    const output = await bothy(["logs", id, commandId]);
    expect(output).toMatchObject({ code: 3, stdout: "first\nsecond\n" });
    const events = await bothy(["logs", id]);
    expect(events.stdout).toMatch(/sandbox\.created/);
    expect(events.stdout).toMatch(new RegExp(`command\\.exited  command_id="${commandId}".*exit_code=3`));
    const json = (await bothy(["logs", "--json", id])).stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { type: string });
    expect(json[0]?.type).toBe("sandbox.created");
  });

  it("shell: an interactive PTY through a real terminal (script), with resize and the exit status", async () => {
    const id = await newSandbox();
    // `script` gives bothy a terminal of 100x30; 4 s in, a background stty resizes it to 120x40,
    // and the kernel's SIGWINCH must reach the sandbox's terminal.
    const inner = `stty cols 100 rows 30; (sleep 4; stty cols 120 rows 40 </dev/tty) & exec ${process.execPath} ${BOTHY} shell ${id}`;
    const child = spawn("script", ["-qfec", inner, "/dev/null"], {
      env: { ...process.env, BOTHY_URL: ts.url, TERM: "xterm" },
      stdio: ["pipe", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.on("data", (c: Buffer) => (out += c.toString()));
    child.stderr.on("data", (c: Buffer) => (out += c.toString()));
    const exited = new Promise<number | null>((r) => child.on("close", (code) => r(code)));
    const until = async (re: RegExp, ms = 20_000): Promise<void> => {
      const end = Date.now() + ms;
      while (!re.test(out)) {
        if (Date.now() > end) throw new Error(`no ${re} in terminal output: ${JSON.stringify(out)}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    };
    try {
      await until(/# $/);
      child.stdin.write("stty size; hostname\r");
      await until(new RegExp(`30 100\\r+\\n${id}`));
      await until(/40 120|# $/, 8000);
      for (let i = 0; i < 20 && !/40 120/.test(out); i++) {
        child.stdin.write("stty size\r");
        await new Promise((r) => setTimeout(r, 500));
      }
      expect(out).toContain("40 120");
      child.stdin.write("exit 5\r");
      expect(await exited).toBe(5);
    } finally {
      child.kill("SIGKILL");
    }
  });

  it("doctor checks the host and template ls lists templates", async () => {
    const r = await bothy(["doctor", "--json"]);
    const report = JSON.parse(r.stdout) as {
      ok: boolean;
      checks: Array<{ name: string; status: string; fix?: string }>;
    };
    expect(report.checks.map((c) => c.name)).toEqual([
      "root",
      "runsc",
      "qemu",
      "guest kernel",
      "host kernel",
      "limits (gVisor)",
      "limits (QEMU)",
      "KVM",
      "nftables",
      "ip_forward",
      "disk space",
      "server",
    ]);
    expect(r.code).toBe(report.ok ? 0 : 1);
    for (const c of report.checks) if (c.status !== "ok") expect(c.fix).toBeTruthy();
    expect(report.checks.find((c) => c.name === "runsc")?.status).toBe("ok");
    // This host's cgroups (v1 hybrid here, v2 on others) limit both drivers' sandboxes.
    for (const name of ["limits (gVisor)", "limits (QEMU)"])
      expect(report.checks.find((c) => c.name === name)?.status).toBe("ok");
    expect(report.checks.find((c) => c.name === "server")?.status).toBe("ok");
    const text = await bothy(["doctor"]);
    expect(text.stdout).toMatch(/^ok\s+root\s+running as root$/m);

    const templates = await bothy(["template", "ls", "--json"], {
      env: { BOTHY_TEMPLATES_DIR: ts.config.templatesDir },
    });
    expect(
      (JSON.parse(templates.stdout) as { templates: Array<{ name: string }> }).templates.map((t) => t.name),
    ).toContain("seed");
    // Built already in the shared cache: the build answers from it (a real build is template-build.test.ts).
    const build = await bothy(["template", "build", "seed"], { env: { BOTHY_TEMPLATES_DIR: ts.config.templatesDir } });
    expect(build.code).toBe(0);
    expect(build.stdout + build.stderr).toMatch(/seed [0-9a-f]{12}/);
    expect(
      (await bothy(["template", "build", "../etc"], { env: { BOTHY_TEMPLATES_DIR: ts.config.templatesDir } })).code,
    ).not.toBe(0);
  });
});
