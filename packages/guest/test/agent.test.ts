import { spawn, type ChildProcessByStdio } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtemp, readFile, readdir, rm, stat, symlink } from "node:fs/promises";
import { join } from "node:path";
import type { Readable, Writable } from "node:stream";
import { fileURLToPath } from "node:url";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { encodeFrame, FrameDecoder, OUTPUT_WINDOW_BYTES, resyncPreamble, type RawFrame } from "@bothy/protocol";
import { AgentClient } from "../../server/src/agent/agent-client.ts";

/** The bundled agent, run by the host's Node over pipes: the same bytes a sandbox runs. */
const AGENT = fileURLToPath(new URL("../dist/agent.mjs", import.meta.url));
/** The static helper built beside it; sandboxes have it at /opt/bothy/bothy-helper. */
const HELPER = fileURLToPath(new URL("../dist/bothy-helper", import.meta.url));

let child: ChildProcessByStdio<Writable, Readable, null>;
let agent: AgentClient;
let dir: string;

async function startAgent(env: NodeJS.ProcessEnv): Promise<void> {
  dir = await mkdtemp("/tmp/bothy-agent-");
  child = spawn(process.execPath, [AGENT], { stdio: ["pipe", "pipe", "inherit"], env: { ...process.env, ...env } });
  agent = new AgentClient(child.stdout, child.stdin);
  await agent.handshake(10_000);
}

async function stopAgent(): Promise<void> {
  child.kill("SIGKILL");
  await rm(dir, { recursive: true, force: true });
}

function run(cmd: string, opts: { stdin?: boolean; credit?: boolean } = {}) {
  const out: Record<1 | 2, Buffer[]> = { 1: [], 2: [] };
  let bytes = 0;
  const pendingCredit: Array<() => void> = [];
  let resolveExit!: (v: { code: number | null; signal: string | null }) => void;
  const exited = new Promise<{ code: number | null; signal: string | null }>((r) => (resolveExit = r));
  let pid = 0;
  const handle = agent.exec(
    { cmd, cwd: dir, stdin: opts.stdin },
    {
      onStarted: (p) => (pid = p),
      onOutput: (fd, data, consumed) => {
        bytes += data.length;
        if (bytes < 64 * 1024) out[fd].push(Buffer.from(data));
        if (opts.credit === false) pendingCredit.push(consumed);
        else consumed();
      },
      onExited: (code, signal) => resolveExit({ code, signal }),
      onError: () => undefined,
    },
  );
  return {
    handle,
    exited,
    out,
    bytes: () => bytes,
    pid: () => pid,
    release: () => pendingCredit.splice(0).forEach((f) => f()),
  };
}

describe("guest agent", () => {
  // Without a helper (as outside a sandbox, or an initramfs from before it): child_process.
  beforeEach(() => startAgent({ BOTHY_HELPER: "/nonexistent/bothy-helper" }));
  afterEach(stopAgent);

  it("runs a command with separate stdout, stderr and exit code", async () => {
    const r = run("echo out; echo err >&2; exit 5");
    expect(await r.exited).toEqual({ code: 5, signal: null });
    expect(Buffer.concat(r.out[1]).toString()).toBe("out\n");
    expect(Buffer.concat(r.out[2]).toString()).toBe("err\n");
  });

  it("feeds stdin and closes it on request", async () => {
    const r = run("tr a-z A-Z", { stdin: true });
    r.handle.stdin(Buffer.from("hello "));
    r.handle.stdin(Buffer.from("world"), true);
    await r.exited;
    expect(Buffer.concat(r.out[1]).toString()).toBe("HELLO WORLD");
  });

  it("signals the whole process group", async () => {
    const r = run("sleep 30 | cat");
    await new Promise((res) => setTimeout(res, 200));
    r.handle.signal("SIGTERM");
    expect((await r.exited).signal).toBe("SIGTERM");
  });

  it("stops producing when output is not acknowledged, without growing memory", async () => {
    const rssBefore = await rssKb(child.pid ?? 0);
    const r = run("head -c 100000000 /dev/zero", { credit: false });
    await new Promise((res) => setTimeout(res, 1500));
    const stalled = r.bytes();
    expect(stalled).toBeGreaterThan(0);
    expect(stalled).toBeLessThanOrEqual(OUTPUT_WINDOW_BYTES + 64 * 1024);
    await new Promise((res) => setTimeout(res, 300));
    expect(r.bytes()).toBe(stalled); // paused, not merely slow
    // Now acknowledge as we go: everything arrives, and the agent stays small.
    const timer = setInterval(() => r.release(), 1);
    let peak = 0;
    const sampler = setInterval(() => void rssKb(child.pid ?? 0).then((kb) => (peak = Math.max(peak, kb))), 50);
    await r.exited;
    clearInterval(timer);
    clearInterval(sampler);
    expect(r.bytes()).toBe(100_000_000);
    expect(peak - rssBefore).toBeLessThan(64 * 1024); // KiB: far below the 100 MB that passed through
  });

  it("writes files atomically, reads and stats them", async () => {
    const path = join(dir, "f.txt");
    const first = await agent.writeFile(path, Buffer.from("one"));
    expect(first.size).toBe(3);
    expect((await agent.readFile(path)).toString()).toBe("one");
    expect(await agent.stat(path)).toMatchObject({ type: "file", size: 3, mode: 0o644 });
    // A write conditioned on a stale hash fails and leaves the file and directory as they were.
    await expect(agent.writeFile(path, Buffer.from("two"), { ifSha256: "0".repeat(64) })).rejects.toMatchObject({
      code: "precondition_failed",
    });
    expect(await readFile(path, "utf8")).toBe("one");
    expect(await readdir(dir)).toEqual(["f.txt"]);
    await agent.writeFile(path, Buffer.from("two"), { ifSha256: first.sha256, mode: 0o600 });
    expect(await readFile(path, "utf8")).toBe("two");
    expect((await agent.stat(path)).mode).toBe(0o600);
    const big = Buffer.alloc(3 * 1024 * 1024 + 7, 7);
    await agent.writeFile(join(dir, "big"), big);
    expect((await agent.readFile(join(dir, "big"))).equals(big)).toBe(true);
  });

  it("lists, makes, renames and removes, and stats with a hash", async () => {
    await agent.mkdir(join(dir, "a/b/c"), true);
    await expect(agent.mkdir(join(dir, "a"))).rejects.toMatchObject({ code: "file_exists" });
    await agent.writeFile(join(dir, "a/x.txt"), Buffer.from("xyz"));
    expect((await agent.list(join(dir, "a"))).entries.map((e) => [e.name, e.type, e.size])).toEqual([
      ["b", "dir", expect.any(Number)],
      ["x.txt", "file", 3],
    ]);
    const st = await agent.stat(join(dir, "a/x.txt"), { sha256: true });
    expect(st.sha256).toBe(createHash("sha256").update("xyz").digest("hex"));
    await agent.rename(join(dir, "a/x.txt"), join(dir, "a/y.txt"));
    await expect(agent.remove(join(dir, "a"))).rejects.toMatchObject({ code: "file_error" }); // not empty
    await agent.remove(join(dir, "a"), true);
    expect(await readdir(dir)).toEqual([]);
  });

  it("stops a read the host cancels", async () => {
    const big = join(dir, "big");
    await agent.writeFile(big, Buffer.alloc(8 * 1024 * 1024, 1));
    const { stream } = await agent.openRead(big);
    for await (const _chunk of stream) break; // takes one chunk, then gives up
    // The agent still answers, so the cancelled read did not wedge the channel.
    expect((await agent.stat(big)).size).toBe(8 * 1024 * 1024);
  });

  it("makes parents through symlinks, and refuses a link loop or a file in the way", async () => {
    await symlink(dir, join(dir, "self"));
    await symlink("loop2", join(dir, "loop1"));
    await symlink("loop1", join(dir, "loop2"));
    await agent.writeFile(join(dir, "plain"), Buffer.from("p"));
    await agent.mkdir(join(dir, "self/self/self/made/deep"), true);
    expect((await stat(join(dir, "made/deep"))).isDirectory()).toBe(true);
    await agent.mkdir(join(dir, "self/made/deep"), true); // exists: fine with parents
    await expect(agent.mkdir(join(dir, "loop1/x"), true)).rejects.toMatchObject({ code: "file_error" });
    await expect(agent.mkdir(join(dir, "plain/x"), true)).rejects.toMatchObject({ code: "file_exists" });
    await agent.mkdir(join(dir, "self/alone"));
    expect((await stat(join(dir, "alone"))).isDirectory()).toBe(true);
  });

  it("reads the file a symlink names, with its size, and refuses what is not a regular file", async () => {
    const data = Buffer.alloc(100_000, 3);
    await agent.writeFile(join(dir, "big"), data);
    await symlink("big", join(dir, "link"));
    const { stat: opened, stream } = await agent.openRead(join(dir, "link"));
    expect(opened).toMatchObject({ type: "file", size: data.length });
    const got: Buffer[] = [];
    for await (const chunk of stream) got.push(chunk as Buffer);
    expect(Buffer.concat(got).equals(data)).toBe(true);
    await symlink(".", join(dir, "dirlink"));
    await expect(agent.openRead(join(dir, "dirlink"))).rejects.toMatchObject({
      code: "file_error",
      details: { guest_code: "not_a_file" },
    });
    await new Promise<void>((res, rej) =>
      spawn("mkfifo", [join(dir, "fifo")]).on("exit", (code) => (code === 0 ? res() : rej(new Error("mkfifo")))),
    );
    await expect(agent.openRead(join(dir, "fifo"))).rejects.toMatchObject({ details: { guest_code: "not_a_file" } });
  });

  it("reports missing files", async () => {
    await expect(agent.readFile(join(dir, "nope"))).rejects.toMatchObject({ code: "file_not_found" });
    await expect(agent.stat(join(dir, "nope"))).rejects.toMatchObject({ code: "file_not_found" });
  });
});

describe("guest agent never trusts its input", () => {
  beforeEach(() => startAgent({ BOTHY_HELPER: "/nonexistent/bothy-helper" }));
  afterEach(stopAgent);

  it("answers an invalid frame with bad_frame and keeps working", async () => {
    const { send, frames } = rawSession();
    send({ t: "exec", id: 9, cmd: "true", evil: 1 });
    send({ t: "exec", id: 10, cmd: "echo fine", cwd: dir });
    await waitFor(() => frames.some((f) => (f.header as { t: string; id?: number }).t === "exited"));
    expect(frames.find((f) => (f.header as { t: string }).t === "error")?.header).toMatchObject({
      id: 9,
      code: "bad_frame",
    });
  });

  it("drops input after a framing error, without buffering it, until a resync preamble; then works again", async () => {
    const { send, frames } = rawSession();
    const prefix = Buffer.alloc(8);
    prefix.writeUInt32BE(100, 0);
    prefix.writeUInt32BE(0xffffffff, 4);
    child.stdin.write(prefix);
    // A host that died in the middle of a frame, and bytes that mean nothing.
    child.stdin.write(encodeFrame({ t: "exec", id: 20, cmd: "echo lost", cwd: dir }).subarray(0, 11));
    send({ t: "exec", id: 21, cmd: "echo ignored", cwd: dir });
    await new Promise((r) => setTimeout(r, 300));
    expect(frames.filter((f) => (f.header as { id?: number }).id === 21)).toEqual([]);
    expect(child.exitCode).toBeNull();

    child.stdin.write(resyncPreamble());
    send({ t: "resync" });
    send({ t: "exec", id: 22, cmd: "echo back", cwd: dir });
    await waitFor(() =>
      frames.some(
        (f) => (f.header as { t: string; id?: number }).t === "exited" && (f.header as { id?: number }).id === 22,
      ),
    );
    expect(frames.some((f) => (f.header as { t: string }).t === "hello")).toBe(true);
    const out = frames.filter(
      (f) => (f.header as { t: string; id?: number }).t === "output" && (f.header as { id?: number }).id === 22,
    );
    expect(Buffer.concat(out.map((f) => f.payload)).toString()).toBe("back\n");
    expect(await rssKb(child.pid ?? 0)).toBeLessThan(200 * 1024);
  });

  it("repeats hello until acknowledged", async () => {
    const fresh = spawn(process.execPath, [AGENT], { stdio: ["pipe", "pipe", "inherit"] });
    const dec = new FrameDecoder();
    let hellos = 0;
    fresh.stdout.on(
      "data",
      (c: Buffer) => (hellos += dec.push(c).filter((f) => (f.header as { t: string }).t === "hello").length),
    );
    // A second hello with no ack in between is the repeat; a loaded box may take a while to show it.
    try {
      await waitFor(() => hellos >= 2, 60_000);
    } finally {
      fresh.kill("SIGKILL");
    }
    expect(hellos).toBeGreaterThanOrEqual(2);
  });
});

describe("guest agent with the spawner helper", () => {
  beforeEach(async () => {
    await startAgent({ BOTHY_HELPER: HELPER });
    // The helper comes up beside the agent; until then commands go through Node.
    await waitFor(async () => (await runText("cat /proc/$PPID/comm")) === "bothy-helper\n");
  });
  afterEach(stopAgent);

  it("starts commands from the helper, with separate stdout, stderr, exit code, cwd and environment", async () => {
    const r = run('echo "$PWD $BOTHY_X"; echo err >&2; exit 5');
    const started = r.exited.then(() => r.pid());
    expect(await r.exited).toEqual({ code: 5, signal: null });
    expect(Buffer.concat(r.out[1]).toString()).toBe(`${dir} \n`);
    expect(Buffer.concat(r.out[2]).toString()).toBe("err\n");
    expect(await started).toBeGreaterThan(0);
  });

  it("feeds stdin and closes it on request", async () => {
    const r = run("tr a-z A-Z", { stdin: true });
    r.handle.stdin(Buffer.from("hello "));
    r.handle.stdin(Buffer.from("world"), true);
    await r.exited;
    expect(Buffer.concat(r.out[1]).toString()).toBe("HELLO WORLD");
  });

  it("gives a command without stdin /dev/null", async () => {
    expect(await runText("cat; readlink /proc/self/fd/0")).toBe("/dev/null\n");
  });

  it("signals the whole process group, and reports a death by signal", async () => {
    const r = run("sleep 30 | cat");
    await waitFor(() => r.pid() > 0);
    r.handle.signal("SIGTERM");
    expect((await r.exited).signal).toBe("SIGTERM");
    expect(await run("kill -KILL $$").exited).toEqual({ code: null, signal: "SIGKILL" });
  });

  it("finishes a command whose background child keeps its output open", async () => {
    const started = Date.now();
    const r = run("sleep 20 & echo bg");
    expect(await r.exited).toEqual({ code: 0, signal: null });
    expect(Date.now() - started).toBeLessThan(10_000);
  });

  it("reports a working directory that does not exist as spawn_failed", async () => {
    const errors: string[] = [];
    await new Promise<void>((resolve) =>
      agent.exec(
        { cmd: "true", cwd: join(dir, "missing") },
        {
          onStarted: () => undefined,
          onOutput: (_fd, _d, consumed) => consumed(),
          onExited: () => resolve(),
          onError: (err) => errors.push((err as { code?: string }).code ?? String(err)),
        },
      ),
    );
    expect(errors).toEqual(["invalid_command"]);
  });

  it("stops producing when output is not acknowledged", async () => {
    const r = run("head -c 20000000 /dev/zero", { credit: false });
    await new Promise((res) => setTimeout(res, 1000));
    const stalled = r.bytes();
    expect(stalled).toBeGreaterThan(0);
    expect(stalled).toBeLessThanOrEqual(OUTPUT_WINDOW_BYTES + 64 * 1024);
    await new Promise((res) => setTimeout(res, 300));
    expect(r.bytes()).toBe(stalled);
    const timer = setInterval(() => r.release(), 1);
    await r.exited;
    clearInterval(timer);
    expect(r.bytes()).toBe(20_000_000);
  });

  it("runs many commands at once", async () => {
    const outs = await Promise.all(Array.from({ length: 20 }, (_, i) => runText(`echo ${i}`)));
    expect(outs).toEqual(Array.from({ length: 20 }, (_, i) => `${i}\n`));
  });

  it("ends the helper with the agent", async () => {
    const helperPid = Number((await runText("echo $PPID")).trim());
    expect(helperPid).toBeGreaterThan(0);
    child.kill("SIGKILL");
    await waitFor(
      async () => !(await readFile(`/proc/${helperPid}/comm`, "utf8").catch(() => "")).startsWith("bothy-helper"),
    );
  });
});

async function runText(cmd: string): Promise<string> {
  const r = run(cmd);
  await r.exited;
  return Buffer.concat(r.out[1]).toString();
}

/** Bypasses the client to send frames the client would never send. */
function rawSession(): { send: (h: object) => void; frames: RawFrame[] } {
  const frames: RawFrame[] = [];
  const dec = new FrameDecoder();
  child.stdout.removeAllListeners("data");
  child.stdout.on("data", (c: Buffer) => frames.push(...dec.push(c)));
  return { send: (h) => child.stdin.write(encodeFrame(h)), frames };
}

async function waitFor(pred: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<void> {
  const start = Date.now();
  while (!(await pred())) {
    if (Date.now() - start > timeoutMs) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function rssKb(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
  return Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0);
}
