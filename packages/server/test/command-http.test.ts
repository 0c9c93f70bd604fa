import { describe, expect, it } from "vitest";
import { COMMAND_OUTPUT_CAP_BYTES } from "@bothy/protocol";
import { abandonableCommand, api, createSandbox, deleteSandbox } from "./helpers/client.ts";
import { IDLE_S, useIdleServer, useServerWithSandbox } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

/** Polls `check` until it holds; fails naming `what` after `ms`. */
async function until(what: string, ms: number, check: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50)); // the poll's pace, not a wait for an outcome
  }
}

describe("POST /sandboxes/{id}/commands (gvisor)", () => {
  let ts: TestServer;
  let id: string;
  useServerWithSandbox("gvisor", (server, sandbox) => {
    ts = server;
    id = sandbox;
  });
  const exec = (body: unknown, sandbox = id, headers: Record<string, string> = {}) =>
    api(ts.url, "POST", `/sandboxes/${sandbox}/commands`, body, headers);

  it("answers exit code, stdout and stderr, and lists the command afterwards", async () => {
    const res = await exec({ cmd: 'echo "out $X"; echo err >&2; pwd', cwd: "/tmp", env: { X: "y" } });
    expect(res.status).toBe(200);
    expect(res.json).toMatchObject({ exit_code: 0, stdout: "out y\n/tmp\n", stderr: "err\n" });
    expect(res.json).not.toHaveProperty("truncated");
    const commandId = String(res.json["command_id"]);
    expect(commandId).toMatch(/^cmd_/);
    const listed = await api(ts.url, "GET", `/sandboxes/${id}/commands`);
    const mine = (listed.json["commands"] as Array<Record<string, unknown>>).find((c) => c["command_id"] === commandId);
    expect(mine).toMatchObject({ state: "exited", exit_code: 0, background: false });
    expect((await api(ts.url, "GET", `/sandboxes/${id}/commands/${commandId}`)).json["state"]).toBe("exited");
  });

  it("has the end's log line and command.exited event written when the client reads the answer", async () => {
    // They are written after the answer, in the same turn of the server's event loop: by the time
    // a client has the answer (it needs another turn to read it), they are there.
    const res = await exec({ cmd: "true" });
    const commandId = String(res.json["command_id"]);
    expect(
      (await ts.server.events.since(0, id)).some(
        (e) => e.type === "command.exited" && e.data["command_id"] === commandId,
      ),
    ).toBe(true);
    expect(ts.events.some((e) => e.event === "command_exited" && e.command_id === commandId)).toBe(true);
  });

  it("answers a non-zero exit with 200 and its code, and binary output as base64", async () => {
    const failed = await exec({ cmd: "echo no >&2; exit 3" });
    expect(failed.status).toBe(200);
    expect(failed.json).toMatchObject({ exit_code: 3, stdout: "", stderr: "no\n" });
    const binary = await exec({ cmd: "printf '\\377\\376'" });
    expect(binary.json).toMatchObject({ exit_code: 0, stdout: "//4=", stdout_encoding: "base64" });
  });

  it("kills a command at its timeout_s and says so", async () => {
    const res = await exec({ cmd: "echo before; sleep 60", timeout_s: 1 });
    expect(res.status).toBe(200);
    expect(res.json).toMatchObject({ exit_code: null, signal: "SIGKILL", timed_out: true, stdout: "before\n" });
  });

  it(`keeps ${COMMAND_OUTPUT_CAP_BYTES} bytes a stream and marks the rest dropped, while the command runs on`, async () => {
    const res = await exec({ cmd: "head -c 17M /dev/zero | tr '\\0' a; echo end >&2" });
    expect(res.status).toBe(200);
    expect(res.json).toMatchObject({ exit_code: 0, stderr: "end\n", truncated: true });
    const stdout = String(res.json["stdout"]);
    expect(stdout.length).toBe(COMMAND_OUTPUT_CAP_BYTES);
    expect(/^a+$/.test(stdout)).toBe(true);
  }, 120_000);

  it("kills the command when its client leaves before the end", async () => {
    const before = new Set(
      ((await api(ts.url, "GET", `/sandboxes/${id}/commands`)).json["commands"] as Array<{ command_id: string }>).map(
        (c) => c.command_id,
      ),
    );
    const client = abandonableCommand(ts.url, id, "sleep 120");
    let commandId = "";
    await until("the command to start", 30_000, async () => {
      const list = (await api(ts.url, "GET", `/sandboxes/${id}/commands`)).json["commands"] as Array<{
        command_id: string;
        state: string;
      }>;
      commandId = list.find((c) => !before.has(c.command_id) && c.state === "running")?.command_id ?? "";
      return commandId !== "";
    });
    client.abort();
    expect(await client.settled).toBeInstanceOf(Error);
    await until("the command to be killed", 30_000, async () => {
      const info = (await api(ts.url, "GET", `/sandboxes/${id}/commands/${commandId}`)).json;
      return info["state"] === "exited";
    });
    const info = (await api(ts.url, "GET", `/sandboxes/${id}/commands/${commandId}`)).json;
    expect(info).toMatchObject({ state: "exited", signal: "SIGKILL", exit_code: null });
  });

  it("answers problem+json when the sandbox goes away under the command", async () => {
    const doomed = await createSandbox(ts.url);
    const pending = api(ts.url, "POST", `/sandboxes/${doomed}/commands`, { cmd: "sleep 120" });
    await until("the command to start", 30_000, async () => {
      const list = (await api(ts.url, "GET", `/sandboxes/${doomed}/commands`)).json["commands"];
      return Array.isArray(list) && list.length > 0;
    });
    await deleteSandbox(ts.url, doomed);
    const res = await pending;
    expect(res.type).toBe("application/problem+json; charset=utf-8");
    // The error that ended the command without an exit status, as a socket's final `error` frame.
    expect([res.status, res.json["code"]]).toEqual([409, "sandbox_not_running"]);
  });

  it("refuses a bad body with 400 problem+json, naming the WebSocket for socket-only options", async () => {
    for (const body of [{}, { cmd: "" }, { cmd: "true", nope: 1 }, { cmd: "true", timeout_s: -1 }, [1]]) {
      const res = await exec(body);
      expect([res.status, res.type, res.json["code"]], JSON.stringify(body)).toEqual([
        400,
        "application/problem+json; charset=utf-8",
        "invalid_command",
      ]);
    }
    for (const option of [{ stdin: true }, { background: true }, { pty: true }]) {
      const res = await exec({ cmd: "true", ...option });
      expect([res.status, res.json["code"]]).toEqual([400, "invalid_command"]);
      expect(String(res.json["detail"])).toContain(`${Object.keys(option)[0]} needs a socket`);
      expect(String(res.json["detail"])).toContain("GET /sandboxes/{id}/command (WebSocket)");
    }
    const notJson = await exec("{", id);
    expect([notJson.status, notJson.json["code"]]).toEqual([400, "invalid_json"]);
  });

  it("answers an unknown sandbox 404, a deleted one 409, and another tenant's key 404", async () => {
    const unknown = await exec({ cmd: "true" }, "sbx_aaaaaaaaaaaaaaaaaaaa");
    expect([unknown.status, unknown.json["code"]]).toEqual([404, "sandbox_not_found"]);

    const other = await createSandbox(ts.url);
    await deleteSandbox(ts.url, other);
    const gone = await exec({ cmd: "true" }, other);
    expect([gone.status, gone.json["code"]]).toEqual([409, "sandbox_not_running"]);

    expect((await api(ts.url, "POST", "/tenants", { tenant: "other" })).status).toBe(201);
    const minted = await api(ts.url, "POST", "/keys", { tenant: "other", name: "other" });
    expect(minted.status).toBe(201);
    const theirs = await exec({ cmd: "touch /tmp/reached" }, id, {
      authorization: `Bearer ${String(minted.json["key"])}`,
    });
    expect([theirs.status, theirs.json["code"]]).toEqual([404, "sandbox_not_found"]);
    expect((await exec({ cmd: "test ! -e /tmp/reached" })).json["exit_code"]).toBe(0);
  });
});

describe("POST /sandboxes/{id}/commands on a sleeping sandbox (gvisor)", () => {
  let ts: TestServer;
  const { asleep, waitForState } = useIdleServer("gvisor", (server) => (ts = server));

  it("wakes it, as a command socket does, and runs the command", async () => {
    const id = await createSandbox(ts.url);
    try {
      expect(await waitForState(id, asleep, IDLE_S + 30)).toBe(asleep);
      const res = await api(ts.url, "POST", `/sandboxes/${id}/commands`, { cmd: "echo awake" });
      expect([res.status, res.json["stdout"], res.json["exit_code"]]).toEqual([200, "awake\n", 0]);
    } finally {
      await deleteSandbox(ts.url, id);
    }
  }, 120_000);
});
