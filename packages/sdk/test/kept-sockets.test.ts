/**
 * The SDK keeps command sockets open for the next foreground command (`?keep=true`): counted by
 * the connections the server accepts, as bench/commands counts them.
 */
import { execFile } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { WebSocket } from "ws";
import { startTestServer, type TestServer } from "../../server/test/helpers/test-server.ts";
import { pollUntil } from "../../server/test/helpers/client.ts";
import { noLeaks } from "../../server/test/helpers/host-state.ts";
import { CommandExitError, InvalidArgumentError, Sandbox } from "../src/index.ts";

describe("SDK kept command sockets [gvisor]", () => {
  let ts: TestServer;
  let connections = 0;
  /** Close codes and reasons of the server's WebSockets, as they close. */
  const closeCodes: string[] = [];

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor" });
    ts.server.app.server.on("connection", () => connections++);
    const wss = (
      ts.server.app as unknown as { websocketServer: { on(e: "connection", l: (ws: WebSocket) => void): void } }
    ).websocketServer;
    wss.on("connection", (ws) => ws.on("close", (code, reason) => closeCodes.push(`${code} ${reason.toString()}`)));
  });

  afterAll(async () => {
    expect(await ts?.stop()).toEqual(noLeaks());
  });

  it("runs many commands on one connection, one per concurrent command, and drops a socket it aborted", async () => {
    const sbx = await Sandbox.create({ baseUrl: ts.url, template: "seed", vcpu: 1, memoryMib: 512 });
    try {
      const before = connections;
      for (let i = 0; i < 5; i++) expect((await sbx.commands.run(`echo run${i}`)).stdout).toBe(`run${i}\n`);
      // A failed command ends its command, not the socket.
      await expect(sbx.commands.run("exit 7")).rejects.toBeInstanceOf(CommandExitError);
      expect((await sbx.commands.run("cat", { stdin: "piped" })).stdout).toBe("piped");
      expect(connections - before).toBe(1);

      // Three at once: the idle socket and two new ones; all three are kept for what follows.
      const together = await Promise.all([1, 2, 3].map((n) => sbx.commands.run(`echo ${n}`)));
      expect(together.map((r) => r.stdout)).toEqual(["1\n", "2\n", "3\n"]);
      expect(connections - before).toBe(3);
      await Promise.all([1, 2, 3].map((n) => sbx.commands.run(`echo ${n}`)));
      expect(connections - before).toBe(3);

      // An aborted command takes its socket with it (the server kills the command): of the three,
      // two are left, and three commands at once open one more.
      const abort = new AbortController();
      const long = sbx.commands.run("echo up; sleep 60", { onStdout: () => abort.abort(), signal: abort.signal });
      await expect(long).rejects.toBeDefined();
      await Promise.all([1, 2, 3].map((n) => sbx.commands.run(`echo ${n}`)));
      expect(connections - before).toBe(4);

      // A refused start (a missing cwd) rejects at its `error`; its socket goes back to the pool
      // at the `ready` that follows, which may come after the caller's next command has opened a
      // socket of its own, so no count is asserted after it.
      await expect(sbx.commands.run("true", { cwd: "/does/not/exist" })).rejects.toBeInstanceOf(InvalidArgumentError);
      expect((await sbx.commands.run("echo after")).stdout).toBe("after\n");
    } finally {
      await sbx.kill();
    }
  });

  it(
    "a script whose sandbox holds an idle kept socket exits by itself, closing it cleanly",
    { timeout: 120_000 },
    async () => {
      const sbx = await Sandbox.create({ baseUrl: ts.url, template: "seed", vcpu: 1, memoryMib: 512 });
      const dir = await mkdtemp(join(tmpdir(), "bothy-kept-"));
      try {
        const sdk = fileURLToPath(new URL("../src/index.ts", import.meta.url));
        const script = join(dir, "script.mts");
        await writeFile(
          script,
          `import { Sandbox } from ${JSON.stringify(sdk)};
const sbx = await Sandbox.connect(${JSON.stringify(sbx.sandboxId)}, { baseUrl: ${JSON.stringify(ts.url)} });
for (const word of ["one", "two"]) process.stdout.write((await sbx.commands.run("echo " + word)).stdout);
`,
        );
        const codesBefore = closeCodes.length;
        const tsx = fileURLToPath(new URL("../../../node_modules/.bin/tsx", import.meta.url));
        // Killed after 60 s, which fails the test: the idle socket must not hold the process.
        const out = await new Promise<string>((resolve, reject) =>
          execFile(tsx, ["--conditions=@bothy/source", script], { timeout: 60_000 }, (err, stdout, stderr) =>
            err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout),
          ),
        );
        expect(out).toBe("one\ntwo\n");
        // One kept socket for both commands, idle when the process exited, closed then with 1000
        // (not dropped, and not by its idle timer).
        await pollUntil("the kept socket to close", () => closeCodes.length > codesBefore);
        expect(closeCodes.slice(codesBefore)).toEqual(["1000 client exiting"]);
      } finally {
        await rm(dir, { recursive: true, force: true });
        await sbx.kill();
      }
    },
  );
});
