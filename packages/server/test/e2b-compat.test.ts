import { get as httpGet } from "node:http";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import {
  CommandExitError,
  InvalidArgumentError,
  FileNotFoundError,
  FileType,
  FilesystemEventType,
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
  TimeoutError,
} from "e2b";
import type { FilesystemEvent } from "e2b";
import { waitNoneDeleting } from "./helpers/client.ts";
import { homeFilesHolding, noLeaks, SANDBOX_TREES } from "./helpers/host-state.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

const PREVIEW_DOMAIN = "e2b-preview.test";

/** A GET to the server by a host name that does not resolve: the Host header names it. */
function getByHost(serverUrl: string, host: string, path: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpGet(`${serverUrl}${path}`, { headers: { host } }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (d: string) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
  });
}

/**
 * The real `e2b` SDK against a real bothy (gVisor), configured only as an E2B user would:
 * E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY.
 */
describe("E2B compatibility (e2b SDK 2.51, gVisor)", () => {
  let ts: TestServer;
  const saved: Record<string, string | undefined> = {};
  const E2B_ENV = ["E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DOMAIN", "E2B_DEBUG"] as const;

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor", BOTHY_PREVIEW_DOMAIN: PREVIEW_DOMAIN });
    for (const name of E2B_ENV) saved[name] = process.env[name];
    delete process.env["E2B_DOMAIN"];
    delete process.env["E2B_DEBUG"];
    process.env["E2B_API_URL"] = `${ts.url}/e2b`;
    process.env["E2B_SANDBOX_URL"] = `${ts.url}/e2b/envd`;
    // E2B keys are bothy keys: the admin key of the test server.
    process.env["E2B_API_KEY"] = ts.apiKey;
  });

  afterAll(async () => {
    for (const name of E2B_ENV) {
      if (saved[name] === undefined) delete process.env[name];
      else process.env[name] = saved[name];
    }
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  /** A sandbox for one test, killed afterwards whatever happens. */
  async function withSandbox<T>(
    opts: Parameters<typeof Sandbox.create>[1],
    use: (sbx: Sandbox) => Promise<T>,
  ): Promise<T> {
    const sbx = await Sandbox.create("base", opts);
    try {
      return await use(sbx);
    } catch (err) {
      console.error(`failed with sandbox ${sbx.sandboxId}`);
      throw err;
    } finally {
      await sbx.kill();
    }
  }

  describe("control plane", () => {
    it("refuses network rules it cannot apply instead of making a sandbox without them", async () => {
      const before = await Sandbox.list().nextItems();
      const refused = await Sandbox.create("base", { network: { denyOut: ["10.0.0.0/8"] } }).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(SandboxError);
      expect((refused as Error).message).toMatch(/^400: .*network is not served.*allow_internet_access/);
      expect((await Sandbox.list().nextItems()).length).toBe(before.length);
    });

    it("creates with timeout and metadata; getInfo shows them", async () => {
      await withSandbox({ timeoutMs: 120_000, metadata: { suite: "e2b", case: "info" } }, async (sbx) => {
        expect(sbx.sandboxId).toMatch(/^sbx_/);
        const info = await sbx.getInfo();
        expect(info).toMatchObject({
          sandboxId: sbx.sandboxId,
          templateId: "seed",
          metadata: { suite: "e2b", case: "info" },
          state: "running",
          cpuCount: 1,
        });
        const lifetime = info.endAt.getTime() - info.startedAt.getTime();
        expect(lifetime).toBeGreaterThan(100_000);
        expect(lifetime).toBeLessThan(200_000);
      });
    });

    it("connect joins a running sandbox by id; its timeout only extends", async () => {
      await withSandbox({ timeoutMs: 600_000 }, async (sbx) => {
        const endAt = (await sbx.getInfo()).endAt.getTime();
        const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 });
        expect(again.sandboxId).toBe(sbx.sandboxId);
        expect((await again.commands.run("echo joined")).stdout).toBe("joined\n");
        expect((await again.getInfo()).endAt.getTime()).toBe(endAt);
        await Sandbox.connect(sbx.sandboxId, { timeoutMs: 3_600_000 });
        expect((await again.getInfo()).endAt.getTime()).toBeGreaterThan(endAt);
      });
      await expect(Sandbox.connect("sbx_doesnotexist")).rejects.toBeInstanceOf(SandboxNotFoundError);
    });

    it("a sleeping sandbox reads as paused; connect and any envd call wake it", async () => {
      await withSandbox({ metadata: { case: "sleep" } }, async (sbx) => {
        await sbx.files.write("kept.txt", "survives sleep");
        await ts.server.manager.sleep(sbx.sandboxId);
        expect((await sbx.getInfo()).state).toBe("paused");
        const paused = await Sandbox.list({ query: { metadata: { case: "sleep" }, state: ["paused"] } }).nextItems();
        expect(paused.map((s) => s.sandboxId)).toEqual([sbx.sandboxId]);
        const woken = await Sandbox.connect(sbx.sandboxId);
        expect((await woken.getInfo()).state).toBe("running");
        expect(await woken.files.read("kept.txt")).toBe("survives sleep");

        await ts.server.manager.sleep(sbx.sandboxId);
        expect((await sbx.commands.run("cat kept.txt")).stdout).toBe("survives sleep");
      });
    });

    it("getMetrics: one sample from inside the sandbox; gVisor refuses pause", async () => {
      await withSandbox({}, async (sbx) => {
        const metrics = await sbx.getMetrics();
        expect(metrics).toHaveLength(1);
        const [m] = metrics;
        expect(m?.cpuCount).toBe(1);
        expect(m?.timestamp).toBeInstanceOf(Date);
        expect(m?.memTotal).toBeGreaterThan(0);
        expect(m?.memUsed).toBeGreaterThan(0);
        expect(m?.memUsed).toBeLessThanOrEqual(m?.memTotal ?? 0);
        expect(m?.diskTotal).toBeGreaterThan(0);
        expect(m?.cpuUsedPct).toBeGreaterThanOrEqual(0);
        expect(m?.cpuUsedPct).toBeLessThanOrEqual(100);
        expect(await sbx.getMetrics({ end: new Date(Date.now() - 3_600_000) })).toEqual([]);

        const err = await sbx.pause().catch((e: unknown) => e);
        expect(err).toBeInstanceOf(SandboxError);
        expect((err as Error).message).toMatch(/^501: .*qemu/);
        expect((await sbx.getInfo()).state).toBe("running");
      });
      await expect(Sandbox.getMetrics("sbx_doesnotexist")).rejects.toBeInstanceOf(SandboxNotFoundError);
      await expect(Sandbox.pause("sbx_doesnotexist")).rejects.toBeInstanceOf(SandboxNotFoundError);
    });

    it("setTimeout moves the end of the sandbox's life", async () => {
      await withSandbox({ timeoutMs: 60_000 }, async (sbx) => {
        const before = (await sbx.getInfo()).endAt.getTime();
        await sbx.setTimeout(3_600_000);
        const after = (await sbx.getInfo()).endAt.getTime();
        expect(after - before).toBeGreaterThan(3_000_000);
      });
    });

    it("lists by metadata, a page at a time", async () => {
      const tag = `list-${Date.now()}`;
      const made: Sandbox[] = [];
      try {
        for (let i = 0; i < 3; i++) made.push(await Sandbox.create("base", { metadata: { tag, n: String(i) } }));
        const other = await Sandbox.create("base", { metadata: { tag: `${tag}-other` } });
        made.push(other);

        const all = Sandbox.list({ query: { metadata: { tag } } });
        const firstPage = await all.nextItems();
        expect(firstPage.map((s) => s.sandboxId).sort()).toEqual(
          made
            .slice(0, 3)
            .map((s) => s.sandboxId)
            .sort(),
        );
        expect(all.hasNext).toBe(false);

        const paged = Sandbox.list({ query: { metadata: { tag } }, limit: 2 });
        const seen: string[] = [];
        let pages = 0;
        while (paged.hasNext) {
          seen.push(...(await paged.nextItems()).map((s) => s.sandboxId));
          pages++;
        }
        expect(pages).toBe(2);
        expect(seen.sort()).toEqual(firstPage.map((s) => s.sandboxId).sort());

        const one = await Sandbox.list({ query: { metadata: { tag, n: "1" } } }).nextItems();
        expect(one.map((s) => s.sandboxId)).toEqual([made[1]?.sandboxId]);
        const paused = await Sandbox.list({ query: { metadata: { tag }, state: ["paused"] } }).nextItems();
        expect(paused).toEqual([]);

        const newestFirst = Sandbox.list({ query: { metadata: { tag }, template: "base" }, order: "desc", limit: 2 });
        const desc: Date[] = [];
        while (newestFirst.hasNext) desc.push(...(await newestFirst.nextItems()).map((s) => s.startedAt));
        expect(desc).toHaveLength(3);
        expect([...desc].sort((a, b) => b.getTime() - a.getTime())).toEqual(desc);
        expect(await Sandbox.list({ query: { metadata: { tag }, template: "nope" } }).nextItems()).toEqual([]);
        const later = new Date(Date.now() + 3_600_000);
        expect(await Sandbox.list({ query: { metadata: { tag }, startedAfter: later } }).nextItems()).toEqual([]);
      } finally {
        for (const sbx of made) await sbx.kill();
      }
    });

    it("kill twice: true, then false; a killed sandbox is not found", async () => {
      const sbx = await Sandbox.create("base");
      try {
        expect(await sbx.kill()).toBe(true);
      } finally {
        expect(await Sandbox.kill(sbx.sandboxId)).toBe(false);
      }
      await expect(sbx.getInfo()).rejects.toBeInstanceOf(SandboxNotFoundError);
      await expect(sbx.setTimeout(60_000)).rejects.toBeInstanceOf(SandboxNotFoundError);
      await expect(Sandbox.getInfo("sbx_doesnotexist")).rejects.toBeInstanceOf(SandboxNotFoundError);
      expect(await Sandbox.kill("sbx_doesnotexist")).toBe(false);
    });

    it("refuses what bothy cannot honour with E2B's error shape", async () => {
      const res = await fetch(`${ts.url}/e2b/v2/sandboxes`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-api-key": ts.apiKey },
        body: JSON.stringify({ templateID: "base", metadata: { "a b": "c" } }),
      });
      expect(res.status).toBe(400);
      const body = (await res.json()) as { code: number; message: string };
      expect(body.code).toBe(400);
      expect(body.message).toMatch(/metadata/);
      const missing = await fetch(`${ts.url}/e2b/no/such/route`);
      expect(missing.status).toBe(404);
      expect(await missing.json()).toMatchObject({ code: 404 });
    });
  });

  describe("envd: commands and files", () => {
    let sbx: Sandbox;

    beforeAll(async () => {
      sbx = await Sandbox.create("base", { envs: { FROM_CREATE: "created", SHARED: "create" } });
    });

    afterAll(async () => {
      await sbx?.kill();
    });

    it("runs a command: stdout and stderr apart, exit code 0", async () => {
      expect(await sbx.isRunning()).toBe(true);
      const result = await sbx.commands.run("echo out; echo err >&2");
      expect(result).toMatchObject({ exitCode: 0, stdout: "out\n", stderr: "err\n" });
    });

    it("a non-zero exit raises CommandExitError with the exit code and output", async () => {
      const err = await sbx.commands.run("echo partial; echo oops >&2; exit 3").catch((e: unknown) => e);
      expect(err).toBeInstanceOf(CommandExitError);
      expect(err).toMatchObject({ exitCode: 3, stdout: "partial\n", stderr: "oops\n", error: "exit status 3" });
    });

    it("hands output to the onStdout and onStderr callbacks", async () => {
      const out: string[] = [];
      const errs: string[] = [];
      const result = await sbx.commands.run("for i in 1 2 3; do echo line$i; sleep 0.1; done; echo bad >&2", {
        onStdout: (d) => void out.push(d),
        onStderr: (d) => void errs.push(d),
      });
      expect(out.join("")).toBe("line1\nline2\nline3\n");
      expect(errs.join("")).toBe("bad\n");
      expect(result.stdout).toBe(out.join(""));
    });

    it("honours cwd, the create's envs and the command's envs (the command's win)", async () => {
      const result = await sbx.commands.run('pwd; echo "$FROM_CREATE $SHARED $FROM_RUN"', {
        cwd: "/tmp",
        envs: { SHARED: "run", FROM_RUN: "here" },
      });
      expect(result.stdout).toBe("/tmp\ncreated run here\n");
      const home = await sbx.commands.run("pwd");
      expect(home.stdout).toBe("/workspace\n");
      await expect(sbx.commands.run("pwd", { cwd: "/no/such/dir" })).rejects.toBeInstanceOf(InvalidArgumentError);
    });

    it("writes and reads files as text and as bytes, making parent directories", async () => {
      const info = await sbx.files.write("/tmp/e2b/nested/hello.txt", "hello from e2b\n");
      expect(info).toMatchObject({ path: "/tmp/e2b/nested/hello.txt", name: "hello.txt" });
      expect(await sbx.files.read("/tmp/e2b/nested/hello.txt")).toBe("hello from e2b\n");
      expect((await sbx.commands.run("cat /tmp/e2b/nested/hello.txt")).stdout).toBe("hello from e2b\n");

      const bytes = new Uint8Array(70_000).map((_, i) => (i * 7) % 256);
      await sbx.files.write("bin/data.bin", bytes.buffer);
      const back = await sbx.files.read("/workspace/bin/data.bin", { format: "bytes" });
      expect(Buffer.from(back).equals(Buffer.from(bytes))).toBe(true);

      const many = await sbx.files.write([
        { path: "/tmp/many/a.txt", data: "A" },
        { path: "many/b.txt", data: "B" },
      ]);
      expect(many.map((w) => w.path)).toEqual(["/tmp/many/a.txt", "/workspace/many/b.txt"]);
      expect((await sbx.commands.run("cat /tmp/many/a.txt /workspace/many/b.txt")).stdout).toBe("AB");

      await sbx.files.write("octet/plain.txt", "octets", { useOctetStream: true });
      await sbx.files.write("octet/zipped.bin", bytes.buffer, { gzip: true });
      const stream = new ReadableStream<Uint8Array>({
        start(controller) {
          controller.enqueue(new TextEncoder().encode("streamed "));
          controller.enqueue(new TextEncoder().encode("upload"));
          controller.close();
        },
      });
      const streamed = await sbx.files.write("octet/streamed.txt", stream);
      expect(streamed).toMatchObject({ path: "/workspace/octet/streamed.txt", name: "streamed.txt" });
      expect(await sbx.files.read("octet/plain.txt")).toBe("octets");
      expect(
        Buffer.from(await sbx.files.read("octet/zipped.bin", { format: "bytes" })).equals(Buffer.from(bytes)),
      ).toBe(true);
      expect(await sbx.files.read("octet/streamed.txt")).toBe("streamed upload");

      await sbx.files.write("empty.txt", "");
      expect(await sbx.files.read("empty.txt")).toBe("");
    });

    it("reading a missing file raises FileNotFoundError, a directory InvalidArgumentError", async () => {
      await expect(sbx.files.read("/tmp/does-not-exist")).rejects.toBeInstanceOf(FileNotFoundError);
      await expect(sbx.files.read("/tmp")).rejects.toBeInstanceOf(InvalidArgumentError);
    });

    it("background commands: listed, fed on stdin, stdin closed, waited for", async () => {
      const handle = await sbx.commands.run("cat", { background: true, stdin: true });
      const listed = await sbx.commands.list();
      expect(listed.find((p) => p.pid === handle.pid)).toMatchObject({ cmd: "/bin/bash", args: ["-l", "-c", "cat"] });
      await sbx.commands.sendStdin(handle.pid, "hello ");
      await sbx.commands.sendStdin(handle.pid, new TextEncoder().encode("stdin"));
      await sbx.commands.closeStdin(handle.pid);
      expect(await handle.wait()).toMatchObject({ exitCode: 0, stdout: "hello stdin" });
      expect((await sbx.commands.list()).map((p) => p.pid)).not.toContain(handle.pid);
    });

    it("connects to a running command and sees the rest of its output", async () => {
      const first = await sbx.commands.run('read line; echo "got $line"', { background: true, stdin: true });
      const again = await sbx.commands.connect(first.pid);
      await sbx.commands.sendStdin(first.pid, "x\n");
      expect(await again.wait()).toMatchObject({ exitCode: 0, stdout: "got x\n" });
      expect(await first.wait()).toMatchObject({ exitCode: 0, stdout: "got x\n" });
    });

    it("kill ends a background command: wait raises CommandExitError, a second kill is false", async () => {
      const handle = await sbx.commands.run("sleep 600", { background: true });
      expect(await sbx.commands.kill(handle.pid)).toBe(true);
      const err = await handle.wait().catch((e: unknown) => e);
      expect(err).toBeInstanceOf(CommandExitError);
      expect(err).toMatchObject({ exitCode: -1 });
      expect(await sbx.commands.kill(handle.pid)).toBe(false);
      await expect(sbx.commands.connect(handle.pid)).rejects.toThrow();
    });

    it("a command's timeout kills it in the sandbox, as envd's deadline does", async () => {
      await expect(sbx.commands.run("sleep 600", { timeoutMs: 1500 })).rejects.toBeInstanceOf(TimeoutError);
      // The server kills it at the same deadline: wait for that, not for a guessed time.
      await vi.waitFor(
        () =>
          expect(
            ts.events.some(
              (ev) => ev.event === "command_exited" && ev.sandbox_id === sbx.sandboxId && ev.timed_out === true,
            ),
          ).toBe(true),
        { timeout: 30_000 },
      );
    });

    it("filesystem: makeDir, list (with depth), getInfo, exists, rename, remove", async () => {
      expect(await sbx.files.makeDir("/tmp/fs/a/b")).toBe(true);
      expect(await sbx.files.makeDir("/tmp/fs/a/b")).toBe(false);
      await sbx.files.write("/tmp/fs/a/f.txt", "12345");
      const listed = await sbx.files.list("/tmp/fs/a");
      expect(listed.map((e) => [e.name, e.type, e.path])).toEqual([
        ["b", FileType.DIR, "/tmp/fs/a/b"],
        ["f.txt", FileType.FILE, "/tmp/fs/a/f.txt"],
      ]);
      const deep = await sbx.files.list("/tmp/fs", { depth: 3 });
      expect(deep.map((e) => e.path).sort()).toEqual(["/tmp/fs/a", "/tmp/fs/a/b", "/tmp/fs/a/f.txt"]);
      const info = await sbx.files.getInfo("/tmp/fs/a/f.txt");
      expect(info).toMatchObject({
        name: "f.txt",
        type: FileType.FILE,
        size: 5,
        permissions: "-rw-r--r--",
        owner: "root",
      });
      expect(info.modifiedTime).toBeInstanceOf(Date);
      expect(await sbx.files.exists("/tmp/fs/a/f.txt")).toBe(true);
      expect(await sbx.files.exists("/tmp/fs/nothing")).toBe(false);
      const moved = await sbx.files.rename("/tmp/fs/a/f.txt", "/tmp/fs/g.txt");
      expect(moved).toMatchObject({ path: "/tmp/fs/g.txt", name: "g.txt" });
      expect(await sbx.files.read("/tmp/fs/g.txt")).toBe("12345");
      await sbx.files.remove("/tmp/fs");
      expect(await sbx.files.exists("/tmp/fs")).toBe(false);
      await expect(sbx.files.getInfo("/tmp/fs/g.txt")).rejects.toBeInstanceOf(FileNotFoundError);
    });

    it("PTY: create, input, resize, output through onData, exit code", async () => {
      const enc = new TextEncoder();
      const dec = new TextDecoder();
      let screen = "";
      const term = await sbx.pty.create({
        cols: 80,
        rows: 24,
        envs: { FROM_PTY: "pty-env" },
        onData: (d) => void (screen += dec.decode(d, { stream: true })),
        timeoutMs: 0,
      });
      expect((await sbx.commands.list()).find((p) => p.pid === term.pid)).toMatchObject({ args: ["-i", "-l"] });
      await sbx.pty.sendInput(term.pid, enc.encode('stty size; echo "T=$TERM E=$FROM_PTY"; tty\n'));
      await vi.waitFor(() => expect(screen).toMatch(/24 80[\s\S]*T=xterm-256color E=pty-env[\s\S]*\/dev\/pts\//), {
        timeout: 30_000,
      });
      await sbx.pty.resize(term.pid, { cols: 132, rows: 40 });
      // The guest applies a resize after Update has answered: ask again until the new size shows.
      await vi.waitFor(
        async () => {
          if (!screen.includes("40 132")) await sbx.pty.sendInput(term.pid, enc.encode("stty size\n"));
          expect(screen).toContain("40 132");
        },
        { timeout: 30_000, interval: 500 },
      );
      await sbx.pty.sendInput(term.pid, enc.encode("exit 7\n"));
      const err = await term.wait().catch((e: unknown) => e);
      expect(err).toBeInstanceOf(CommandExitError);
      expect(err).toMatchObject({ exitCode: 7 });
      expect(await sbx.pty.kill(term.pid)).toBe(false);

      const killed = await sbx.pty.create({ cols: 80, rows: 24, onData: () => undefined, timeoutMs: 0 });
      const joined = await sbx.pty.connect(killed.pid, { onData: () => undefined, timeoutMs: 0 });
      expect(await sbx.pty.kill(killed.pid)).toBe(true);
      // Killed by a signal, as envd reports it, to the creating and the connected handle alike.
      expect(await killed.wait().catch((e: unknown) => e)).toMatchObject({ exitCode: -1 });
      expect(await joined.wait().catch((e: unknown) => e)).toMatchObject({ exitCode: -1 });
      // A command without a terminal cannot be resized.
      const plain = await sbx.commands.run("sleep 600", { background: true });
      await expect(sbx.pty.resize(plain.pid, { cols: 10, rows: 10 })).rejects.toBeInstanceOf(InvalidArgumentError);
      await sbx.commands.kill(plain.pid);
    });

    it("watchDir: create, write and remove events; recursive reaches subdirectories", async () => {
      await sbx.files.makeDir("/tmp/watched/sub");
      const flat: FilesystemEvent[] = [];
      const handle = await sbx.files.watchDir("/tmp/watched", (e) => void flat.push(e), { timeoutMs: 0 });
      try {
        await sbx.files.write("/tmp/watched/sub/deep.txt", "not seen without recursive");
        await sbx.files.write("/tmp/watched/a.txt", "one");
        await sbx.files.write("/tmp/watched/a.txt", "two");
        await sbx.commands.run("echo three >> /tmp/watched/a.txt");
        await sbx.files.remove("/tmp/watched/a.txt");
        await vi.waitFor(() => expect(flat).toContainEqual({ name: "a.txt", type: FilesystemEventType.REMOVE }), {
          timeout: 30_000,
        });
        const kinds = flat.filter((e) => e.name === "a.txt").map((e) => e.type);
        const { CREATE, WRITE, REMOVE } = FilesystemEventType;
        expect(kinds[0]).toBe(CREATE);
        expect(kinds.slice(1, -1).every((k) => k === WRITE)).toBe(true);
        expect(kinds.at(-1)).toBe(REMOVE);
        expect(kinds.filter((k) => k === CREATE)).toHaveLength(1);
        expect(kinds.filter((k) => k === WRITE).length).toBeGreaterThanOrEqual(3);
        // bothy's own temporary files do not show.
        expect(flat.filter((e) => e.name.includes(".bothy-"))).toEqual([]);
        expect(flat.map((e) => e.name)).not.toContain("sub/deep.txt");
      } finally {
        await handle.stop();
      }

      const deep: FilesystemEvent[] = [];
      const recursive = await sbx.files.watchDir("/tmp/watched", (e) => void deep.push(e), {
        recursive: true,
        timeoutMs: 0,
      });
      try {
        await sbx.files.write("/tmp/watched/sub/b.txt", "two");
        await vi.waitFor(() => expect(deep).toContainEqual({ name: "sub/b.txt", type: FilesystemEventType.CREATE }), {
          timeout: 30_000,
        });
      } finally {
        await recursive.stop();
      }
      await expect(sbx.files.watchDir("/tmp/no-such-dir", () => undefined)).rejects.toBeInstanceOf(FileNotFoundError);
    });

    it("E2b-Sandbox-Port other than envd's reaches that port in the sandbox; getHost names it", async () => {
      const server = await sbx.commands.run(
        `exec node -e 'require("http").createServer((q, r) => r.end(q.method + " " + q.url + " " + q.headers["x-probe"])).listen(8000)'`,
        { background: true, timeoutMs: 0 },
      );
      try {
        const { envdAccessToken } = (await (await fetch(`${ts.url}/e2b/sandboxes/${sbx.sandboxId}`)).json()) as {
          envdAccessToken: string;
        };
        const trafficToken = sbx.trafficAccessToken;
        expect(trafficToken).toBeTruthy();
        // As code-interpreter calls its Jupyter server: the envd URL, the sandbox and port in headers,
        // the sandbox's traffic token and no API key.
        const viaPort = (token: Record<string, string> = { "e2b-traffic-access-token": trafficToken! }) =>
          fetch(`${process.env["E2B_SANDBOX_URL"]}/execute?x=1`, {
            method: "POST",
            headers: { "e2b-sandbox-id": sbx.sandboxId, "e2b-sandbox-port": "8000", "x-probe": "probe", ...token },
            body: "{}",
          });
        await vi.waitFor(async () => expect((await viaPort()).status).toBe(200), { timeout: 30_000, interval: 250 });
        expect(await (await viaPort()).text()).toBe("POST /execute?x=1 probe");
        // The envd access token opens the sandbox's ports too; no token, or a wrong one, is refused.
        expect((await viaPort({ "x-access-token": envdAccessToken })).status).toBe(200);
        expect((await viaPort({})).status).toBe(401);
        expect((await viaPort({ "e2b-traffic-access-token": envdAccessToken })).status).toBe(401);
        expect((await viaPort({ "x-access-token": trafficToken! })).status).toBe(401);
        // envd's own port still needs the access token.
        const envd = await fetch(`${process.env["E2B_SANDBOX_URL"]}/health`, {
          headers: { "e2b-sandbox-id": sbx.sandboxId, "e2b-sandbox-port": "49983" },
        });
        expect(envd.status).toBe(401);
        expect(envdAccessToken).not.toBe("");

        const host = sbx.getHost(8000);
        expect(host).toBe(`8000-${sbx.sandboxId}.${PREVIEW_DOMAIN}`);
        expect(await getByHost(ts.url, host, "/by-host")).toEqual({ status: 200, body: "GET /by-host undefined" });
      } finally {
        await sbx.commands.kill(server.pid);
      }
    });

    it("signed upload and download URLs reach the sandbox whose token signed them", async () => {
      const uploadUrl = await sbx.uploadUrl("/tmp/signed/up.txt");
      // The SDK drops the envd URL's path: the URL is at the server's root, with no sandbox id.
      expect(new URL(uploadUrl).pathname).toBe("/files");
      const form = new FormData();
      form.append("file", new Blob(["signed upload"]), "up.txt");
      const up = await fetch(uploadUrl, { method: "POST", body: form });
      expect(up.status).toBe(200);
      expect(await up.json()).toEqual([{ path: "/tmp/signed/up.txt", name: "up.txt", type: "file" }]);
      expect(await sbx.files.read("/tmp/signed/up.txt")).toBe("signed upload");

      const down = await fetch(await sbx.downloadUrl("/tmp/signed/up.txt", { useSignatureExpiration: 600 }));
      expect(down.status).toBe(200);
      expect(await down.text()).toBe("signed upload");
      // Whoever holds the link gets the sandbox's bytes as a download that never renders on this origin.
      expect(down.headers.get("content-disposition")).toBe("attachment");
      expect(down.headers.get("content-security-policy")).toBe("sandbox");
      expect(down.headers.get("x-content-type-options")).toBe("nosniff");

      // A signature for reading does not write, a changed path does not verify, an expired one is refused.
      const readSigned = new URL(await sbx.downloadUrl("/tmp/signed/up.txt"));
      expect((await fetch(readSigned, { method: "POST", body: form })).status).toBe(401);
      const otherPath = new URL(readSigned);
      otherPath.searchParams.set("path", "/etc/shadow");
      expect((await fetch(otherPath)).status).toBe(401);
      const expired = new URL(await sbx.downloadUrl("/tmp/signed/up.txt", { useSignatureExpiration: -10 }));
      const refused = await fetch(expired);
      expect(refused.status).toBe(401);
      expect(await refused.json()).toMatchObject({ code: 401, message: expect.stringMatching(/expired/) });
    });

    it("a killed sandbox's envd answers as not running", async () => {
      const gone = await Sandbox.create("base");
      await gone.kill();
      expect(await gone.isRunning()).toBe(false);
      await expect(gone.commands.run("true")).rejects.toBeInstanceOf(SandboxNotFoundError);
    });

    it("refuses envd calls without the sandbox's access token, and never logs the token", async () => {
      const url = `${ts.url}/e2b/envd/files?path=/etc/hostname`;
      for (const token of ["wrong", undefined]) {
        const res = await fetch(url, {
          headers: { "e2b-sandbox-id": sbx.sandboxId, ...(token ? { "x-access-token": token } : {}) },
        });
        expect(res.status).toBe(401);
        expect(await res.json()).toMatchObject({ code: 401 });
      }
      const rpc = await fetch(`${ts.url}/e2b/envd/process.Process/List`, {
        method: "POST",
        headers: { "e2b-sandbox-id": sbx.sandboxId, "content-type": "application/json" },
        body: "{}",
      });
      expect(rpc.status).toBe(401);
      const info = (await (await fetch(`${ts.url}/e2b/sandboxes/${sbx.sandboxId}`)).json()) as {
        envdAccessToken: string;
      };
      const ok = await fetch(url, {
        headers: { "e2b-sandbox-id": sbx.sandboxId, "x-access-token": info.envdAccessToken },
      });
      expect(ok.status).toBe(200);
      // Not in the log, the ledger (its WAL included) or any other file the server keeps in its
      // home (sandbox disks, blank disk images and template trees aside), nor in its events or the
      // guest's environment.
      // Earlier tests' deletes finish first: a teardown removes directories while the walk reads them.
      await waitNoneDeleting(ts.url);
      const { read, hits } = await homeFilesHolding(
        ts.home,
        [info.envdAccessToken, sbx.trafficAccessToken!],
        SANDBOX_TREES,
      );
      expect(read).toEqual(expect.arrayContaining([join(ts.home, "ledger.sqlite"), join(ts.home, "server.log")]));
      expect(hits).toEqual([]);
      expect(JSON.stringify(ts.events)).not.toContain(sbx.trafficAccessToken);
      expect(JSON.stringify(ts.events)).not.toContain(info.envdAccessToken);
      const env = await sbx.commands.run("env");
      expect(env.stdout).not.toContain(info.envdAccessToken);
      expect(env.stdout).not.toContain(sbx.trafficAccessToken);
    });
  });
});
