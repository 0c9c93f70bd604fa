import { createServer, type AddressInfo } from "node:net";
import { Readable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../../server/test/helpers/test-server.ts";
import { noLeaks } from "../../server/test/helpers/host-state.ts";
import {
  CommandExitError,
  CommandTimeoutError,
  ConflictError,
  ConnectionError,
  InvalidArgumentError,
  NotFoundError,
  NotSupportedError,
  Sandbox,
  SandboxError,
  TimeoutError,
} from "../src/index.ts";
import { testDrivers } from "../../server/test/helpers/drivers.ts";
import { withSandbox } from "./helpers/fixture.ts";

const qemuDriver = testDrivers().find((d) => d.name === "qemu");
const qemuMissing = qemuDriver ? qemuDriver.missing : "BOTHY_TEST_DRIVERS to include qemu";

describe("SDK against a real server [gvisor]", () => {
  let ts: TestServer;
  let sbx: Sandbox;
  let baseUrl: string;

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor" });
    baseUrl = ts.url;
    sbx = await Sandbox.create({ baseUrl, template: "seed", vcpu: 1, memoryMib: 512, timeoutS: 600 });
  });

  afterAll(async () => {
    try {
      if (sbx) await sbx.kill();
    } finally {
      expect(await ts?.stop()).toEqual(noLeaks());
    }
  });

  it("quick start: create, run, write and read a file, delete", async () => {
    await withSandbox(baseUrl, async (sandbox) => {
      expect(sandbox.info).toMatchObject({ state: "running", template: "seed", driver: "gvisor" });
      // The README's quick start.
      const r = await sandbox.commands.run("echo hello > greeting.txt && uname -sr");
      expect(r).toMatchObject({ exitCode: 0, stdout: expect.stringMatching(/^Linux \S+\n$/), stderr: "" });
      expect(await sandbox.files.read("greeting.txt")).toBe("hello\n");
      await sandbox.files.write("hello.js", "console.log('hi')");
      expect((await sandbox.commands.run("node hello.js")).stdout).toBe("hi\n");
      expect((await Sandbox.list({ baseUrl })).map((s) => s.sandbox_id)).toContain(sandbox.sandboxId);
    });
  });

  it("takes the base URL from BOTHY_URL and connects to an existing sandbox", async () => {
    const saved = process.env["BOTHY_URL"];
    process.env["BOTHY_URL"] = baseUrl;
    try {
      const again = await Sandbox.connect(sbx.sandboxId);
      expect(again.info.sandbox_id).toBe(sbx.sandboxId);
      expect((await again.commands.run("hostname")).stdout.trim()).toBe(sbx.sandboxId);
    } finally {
      if (saved === undefined) delete process.env["BOTHY_URL"];
      else process.env["BOTHY_URL"] = saved;
    }
  });

  it("streams stdout and stderr to callbacks, with cwd, env and stdin", async () => {
    const out: string[] = [];
    const err: string[] = [];
    const r = await sbx.commands.run("cd .. && pwd; echo $GREETING; cat; echo oops >&2", {
      cwd: "/tmp",
      env: { GREETING: "hi" },
      stdin: "from stdin\n",
      onStdout: (d) => out.push(d),
      onStderr: (d) => err.push(d),
    });
    expect(r.stdout).toBe("/\nhi\nfrom stdin\n");
    expect(out.join("")).toBe(r.stdout);
    expect(err.join("")).toBe("oops\n");

    const streamed: string[] = [];
    const unkept = await sbx.commands.run("echo only streamed; echo here too >&2", {
      keepOutput: false,
      onStdout: (d) => streamed.push(d),
      onStderr: (d) => streamed.push(d),
    });
    expect(unkept).toMatchObject({ exitCode: 0, stdout: "", stderr: "" });
    expect(streamed.join("").split("\n").sort()).toEqual(["", "here too", "only streamed"]);
  });

  it("throws CommandExitError on a non-zero exit unless throwOnError is false", async () => {
    const failed = await sbx.commands.run("echo partial; echo bad >&2; exit 3").catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(CommandExitError);
    expect(failed).toBeInstanceOf(SandboxError);
    expect(failed).toMatchObject({ exitCode: 3, stdout: "partial\n", stderr: "bad\n" });
    const r = await sbx.commands.run("exit 4", { throwOnError: false });
    expect(r.exitCode).toBe(4);
  });

  it("execs a command in one HTTP request: output, exit errors, timeout, typed refusals", async () => {
    const r = await sbx.commands.exec("echo $A; pwd; echo e >&2", { cwd: "/tmp", env: { A: "b" } });
    expect(r).toMatchObject({ exitCode: 0, stdout: "b\n/tmp\n", stderr: "e\n", truncated: false });
    expect(r.commandId).toMatch(/^cmd_/);
    const failed = await sbx.commands.exec("echo partial; exit 3").catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(CommandExitError);
    expect(failed).toMatchObject({ exitCode: 3, stdout: "partial\n" });
    expect((await sbx.commands.exec("exit 4", { throwOnError: false })).exitCode).toBe(4);
    const late = await sbx.commands.exec("echo before; sleep 30", { timeoutS: 1 }).catch((e: unknown) => e);
    expect(late).toBeInstanceOf(CommandTimeoutError);
    expect(late).toMatchObject({ result: { exitCode: null, signal: "SIGKILL", stdout: "before\n" } });
    await expect(sbx.commands.exec("")).rejects.toBeInstanceOf(InvalidArgumentError);
  });

  it("throws TimeoutError when a command runs past timeoutS, with what the command did", async () => {
    const err = await sbx.commands
      .run("echo before; sleep 30", { timeoutS: 1, throwOnError: false })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TimeoutError);
    expect(err).toBeInstanceOf(CommandTimeoutError);
    expect(err).toMatchObject({ code: "command_timeout", result: { exitCode: null, stdout: "before\n" } });
    expect((err as CommandTimeoutError).result.commandId).toMatch(/^cmd_/);
  });

  it("aborts a foreground command with an AbortSignal", async () => {
    const started = Date.now();
    const reason = new Error("enough");
    await expect(sbx.commands.run("sleep 30", { signal: AbortSignal.timeout(500) })).rejects.toMatchObject({
      name: "TimeoutError",
    });
    const controller = new AbortController();
    setTimeout(() => controller.abort(reason), 300);
    await expect(sbx.commands.run("sleep 30", { signal: controller.signal })).rejects.toBe(reason);
    expect(Date.now() - started).toBeLessThan(10_000);
    await expect(Sandbox.list({ baseUrl, signal: AbortSignal.abort(reason) })).rejects.toBe(reason);
  });

  it("runs a background command: handle, stdin, disconnect, re-attach, wait, kill", async () => {
    const h = await sbx.commands.run("read line; echo got $line; sleep 1; echo done", {
      background: true,
      stdin: true,
    });
    expect(h.commandId).toMatch(/^cmd_/);
    h.sendStdin("ping\n");
    h.disconnect();
    await expect(h.wait()).rejects.toMatchObject({ code: "disconnected" });
    const seen: string[] = [];
    const again = await sbx.commands.connect(h.commandId, { onStdout: (d) => seen.push(d) });
    const r = await again.wait();
    expect(r.stdout).toBe("got ping\ndone\n");
    expect(seen.join("")).toBe(r.stdout);
    expect((await sbx.commands.list()).find((c) => c.command_id === h.commandId)).toMatchObject({
      state: "exited",
      exit_code: 0,
      background: true,
    });

    const long = await sbx.commands.run("sleep 60", { background: true });
    expect(await long.kill()).toBe(true);
    await expect(long.wait()).rejects.toMatchObject({ exitCode: null, signal: "SIGKILL" });

    const other = await sbx.commands.run("sleep 60", { background: true });
    other.disconnect();
    expect(await sbx.commands.kill(other.commandId)).toBe(true);
    expect(await sbx.commands.kill(other.commandId)).toBe(false);
  });

  it("runs a shell on a PTY: input, resize, exit status", async () => {
    const chunks: Buffer[] = [];
    const pty = await sbx.pty.create({ cols: 100, rows: 30, onData: (d) => chunks.push(Buffer.from(d)), timeoutS: 60 });
    const text = (): string => Buffer.concat(chunks).toString("utf8");
    // Typed before the shell's prompt, input can be lost when readline sets up the terminal.
    await waitFor(() => /[#$] $/.test(text()), 20_000, text);
    pty.sendStdin("stty size\r");
    await waitFor(() => text().includes("30 100"), 10_000, text);
    pty.resize({ cols: 120, rows: 40 });
    // The agent applies a resize asynchronously (stty on the pty), not in order with input: ask again until it shows.
    for (let i = 0; i < 20 && !text().includes("40 120"); i++) {
      pty.sendStdin("stty size; echo $TERM\r");
      await new Promise((r) => setTimeout(r, 500));
    }
    expect(text()).toContain("40 120");
    pty.sendStdin("exit 7\r");
    const r = await pty.wait();
    expect(r.exitCode).toBe(7);
    expect(text()).toContain("xterm-256color");
  });

  it("reads and writes files as strings, bytes and streams; lists, stats, renames, removes", async () => {
    const f = sbx.files;
    expect(await f.makeDir("/workspace/d/sub")).toBe(true);
    expect(await f.makeDir("/workspace/d/sub")).toBe(false);
    const w = await f.write("d/a.txt", "alpha");
    expect(w).toMatchObject({ path: "d/a.txt", size: 5 });
    const bytes = new Uint8Array([0, 1, 2, 255, 254]);
    await f.write("d/b.bin", bytes, { mode: 0o600 });
    expect(Buffer.from(await f.read("d/b.bin", { format: "bytes" }))).toEqual(Buffer.from(bytes));
    const big = Buffer.alloc(3 * 1024 * 1024, "x");
    await f.write("d/big.txt", Readable.from([big.subarray(0, 1_000_000), big.subarray(1_000_000)]));
    let size = 0;
    for await (const chunk of await f.read("d/big.txt", { format: "stream" })) size += chunk.length;
    expect(size).toBe(big.length);

    const names = (await f.list("/workspace/d")).map((e) => `${e.name}:${e.type}`).sort();
    expect(names).toEqual(["a.txt:file", "b.bin:file", "big.txt:file", "sub:dir"]);
    const st = await f.stat("d/b.bin", { sha256: true });
    expect(st).toMatchObject({ type: "file", size: 5, mode: 0o600 });
    expect(st.mtime).toBeInstanceOf(Date);

    const a = await f.stat("d/a.txt", { sha256: true });
    await f.write("d/a.txt", "beta", { ifMatch: a.sha256 ?? "" });
    await expect(f.write("d/a.txt", "gamma", { ifMatch: a.sha256 ?? "" })).rejects.toBeInstanceOf(ConflictError);

    expect(await f.rename("d/a.txt", "d/c.txt")).toMatchObject({ type: "file", size: 4 });
    expect(await f.exists("d/a.txt")).toBe(false);
    await expect(f.read("d/a.txt")).rejects.toBeInstanceOf(NotFoundError);
    await expect(f.remove("d")).rejects.toBeInstanceOf(SandboxError);
    await f.remove("d", { recursive: true });
    expect(await f.exists("d")).toBe(false);
  });

  it("labels a sandbox with metadata and passes the network policy to the server", async () => {
    const labelled = await Sandbox.create({ baseUrl, metadata: { conversation: "c-42", user: "ada" } });
    try {
      expect(labelled.info.metadata).toEqual({ conversation: "c-42", user: "ada" });
      expect((await Sandbox.connect(labelled.sandboxId, { baseUrl })).info.metadata).toEqual({
        conversation: "c-42",
        user: "ada",
      });
    } finally {
      await labelled.kill();
    }
    await expect(Sandbox.create({ baseUrl, metadata: { "bad key": "x" } })).rejects.toBeInstanceOf(
      InvalidArgumentError,
    );
    // This test server runs with networking off, so a policy is refused: proof that it reached
    // the server as internet/allow_out (network.test.ts proves the policy itself).
    const refused = await Sandbox.create({ baseUrl, network: { internet: false, allowOut: ["203.0.113.10"] } }).catch(
      (e: unknown) => e,
    );
    expect(refused).toBeInstanceOf(NotSupportedError);
    expect(String((refused as Error).message)).toMatch(/internet and allow_out/);
  });

  it.skipIf(qemuMissing !== undefined)(
    "pauses and resumes a QEMU sandbox, keeping its files",
    { timeout: 300_000 },
    async () => {
      const vm = await Sandbox.create({ baseUrl, driver: "qemu" });
      try {
        await vm.files.write("note.txt", "kept");
        expect((await vm.pause()).state).toBe("paused");
        expect((await vm.resume()).state).toBe("running");
        expect(await vm.files.read("note.txt")).toBe("kept");
      } finally {
        await vm.kill();
      }
    },
  );

  it("rebuilds typed errors from the server's codes", async () => {
    const notFound = await Sandbox.connect("sbx_aaaaaaaaaaaaaaaaaaaa", { baseUrl }).catch((e: unknown) => e);
    expect(notFound).toBeInstanceOf(NotFoundError);
    expect(notFound).toMatchObject({ code: "sandbox_not_found", status: 404, name: "NotFoundError" });
    await expect(Sandbox.create({ baseUrl, vcpu: 999 })).rejects.toBeInstanceOf(InvalidArgumentError);
    await expect(sbx.pause()).rejects.toBeInstanceOf(NotSupportedError);
    await expect(sbx.commands.run("")).rejects.toBeInstanceOf(InvalidArgumentError);
    const port = await closedPort();
    const refused = await Sandbox.list({ baseUrl: `http://127.0.0.1:${port}` }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(ConnectionError);
    expect(String((refused as Error).message)).toContain(
      `Cannot reach bothy at http://127.0.0.1:${port} (ECONNREFUSED)`,
    );
  });

  it("sets the timeout, honours an idempotency key, reports events, and kills twice", async () => {
    const key = `sdk-${Date.now()}`;
    const a = await Sandbox.create({ baseUrl, idempotencyKey: key });
    try {
      const b = await Sandbox.create({ baseUrl, idempotencyKey: key });
      expect(b.sandboxId).toBe(a.sandboxId);
      const before = Date.parse(a.info.expires_at ?? "");
      const info = await a.setTimeout(30);
      expect(Date.parse(info.expires_at ?? "")).toBeLessThan(before);
      await a.commands.run("true");
    } finally {
      await a.kill();
    }
    await a.kill({ wait: true });
    expect(a.info.state).toBe("deleted");
    expect(await a.isRunning()).toBe(false);
    const types: string[] = [];
    for await (const ev of a.events({ since: 0, follow: false })) types.push(ev.type);
    expect(types).toEqual(["sandbox.created", "command.exited", "sandbox.deleted"]);
  });
});

/** A loopback port nothing listens on. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as AddressInfo;
  await new Promise((r) => server.close(r));
  return port;
}

async function waitFor(check: () => boolean, timeoutMs = 10_000, seen?: () => string): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > until)
      throw new Error(`condition not met in time${seen ? `; output so far: ${JSON.stringify(seen())}` : ""}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
