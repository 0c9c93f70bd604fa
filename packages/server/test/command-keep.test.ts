/**
 * A kept command socket (`GET /sandboxes/{id}/command?keep=true`): many commands one after another
 * on one WebSocket, spoken with the raw `ws` client to check the exact frames and close codes.
 * gVisor only: the socket's protocol does not depend on the driver, and sleep and wake are
 * covered per driver by idle-sleep.test.ts.
 */
import { describe, expect, it } from "vitest";
import WebSocket from "ws";
import type { CommandEvent } from "@bothy/protocol";
import { api, createSandbox, pollUntil, runCommand, waitDeleted } from "./helpers/client.ts";
import { IDLE_S, useIdleServer, useServerWithSandbox } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

interface Ran {
  events: CommandEvent[];
  stdout: string;
  stderr: string;
  exit: Extract<CommandEvent, { type: "process_exited" }> | undefined;
  error: Extract<CommandEvent, { type: "error" }> | undefined;
}

/** One kept socket: `run` sends a command and collects its frames up to `ready`. */
class KeptSocket {
  readonly closed: Promise<{ code: number; reason: string }>;
  /** Frames that came outside any `run` (e.g. the error before a close). */
  readonly stray: CommandEvent[] = [];
  private onEvent: ((ev: CommandEvent) => void) | undefined;

  private constructor(readonly ws: WebSocket) {
    ws.on("message", (data) => {
      const ev = JSON.parse(data.toString()) as CommandEvent;
      if (this.onEvent) this.onEvent(ev);
      else this.stray.push(ev);
    });
    this.closed = new Promise((resolve) =>
      ws.on("close", (code, reason) => resolve({ code, reason: reason.toString() })),
    );
  }

  /** Opens a kept socket and reads its first frame, which says it takes commands: `ready`. */
  static async open(wsBase: string, id: string): Promise<KeptSocket> {
    const ws = new WebSocket(`${wsBase}/sandboxes/${id}/command?keep=true`);
    const first = await new Promise<unknown>((resolve, reject) => {
      ws.once("message", (data) => resolve(JSON.parse(data.toString())));
      ws.once("error", reject);
    });
    expect(first).toEqual({ type: "ready" });
    return new KeptSocket(ws);
  }

  run(request: Record<string, unknown> | string, during?: (ev: CommandEvent) => void): Promise<Ran> {
    const ran: Ran = { events: [], stdout: "", stderr: "", exit: undefined, error: undefined };
    return new Promise((resolve, reject) => {
      const onClose = (code: number): void => {
        this.onEvent = undefined;
        reject(new Error(`the kept socket closed (${code}) before ready; frames: ${JSON.stringify(ran.events)}`));
      };
      this.ws.once("close", onClose);
      this.onEvent = (ev) => {
        ran.events.push(ev);
        if (ev.type === "stdout" || ev.type === "stderr") ran[ev.type] += ev.data;
        if (ev.type === "process_exited") ran.exit = ev;
        if (ev.type === "error") ran.error = ev;
        during?.(ev);
        if (ev.type !== "ready") return;
        this.ws.off("close", onClose);
        this.onEvent = undefined;
        resolve(ran);
      };
      this.ws.send(typeof request === "string" ? request : JSON.stringify(request));
    });
  }

  send(message: Record<string, unknown>): void {
    this.ws.send(JSON.stringify(message));
  }
}

describe("kept command socket [gvisor]", () => {
  let ts: TestServer;
  let id: string;
  useServerWithSandbox("gvisor", (server, sandbox) => {
    ts = server;
    id = sandbox;
  });

  it("runs commands one after another: exit codes, stdout, stdin, a signal, a refused start", async () => {
    const kept = await KeptSocket.open(ts.wsUrl, id);
    try {
      const first = await kept.run({ cmd: "echo one; echo err >&2; exit 3" });
      expect(first).toMatchObject({ stdout: "one\n", stderr: "err\n", exit: { exit_code: 3 }, error: undefined });
      expect(first.events.map((e) => e.type).slice(-2)).toEqual(["process_exited", "ready"]);

      const piped = await kept.run({ cmd: "cat; echo done", stdin: true }, (ev) => {
        if (ev.type !== "started") return;
        kept.send({ type: "stdin", data: "hello " });
        kept.send({ type: "stdin", data: Buffer.from("world\n").toString("base64"), encoding: "base64" });
        kept.send({ type: "stdin_eof" });
      });
      expect(piped).toMatchObject({ stdout: "hello world\ndone\n", exit: { exit_code: 0 } });

      const signalled = await kept.run({ cmd: "echo up; sleep 60" }, (ev) => {
        if (ev.type === "stdout") kept.send({ type: "signal", signal: "SIGTERM" });
      });
      expect(signalled.exit).toMatchObject({ exit_code: null, signal: "SIGTERM" });

      // The agent refuses to start it: an error, still process_exited, and the socket goes on.
      const refused = await kept.run({ cmd: "true", cwd: "/does/not/exist" });
      expect(refused.error?.code).toBe("invalid_command");
      expect(refused.events.map((e) => e.type).slice(-2)).toEqual(["process_exited", "ready"]);

      // Input for a command that has already ended is dropped, not taken for the next command.
      kept.send({ type: "stdin", data: "late" });
      kept.send({ type: "signal", signal: "SIGINT" });
      const after = await kept.run({ cmd: "echo again", env: { X: "1" } });
      expect(after).toMatchObject({ stdout: "again\n", exit: { exit_code: 0 } });

      // Every command has its own record.
      const ids = [first, piped, signalled, after].map((r) => r.exit?.command_id);
      expect(new Set(ids).size).toBe(4);
      const listed = (await api(ts.url, "GET", `/sandboxes/${id}/commands`)).json["commands"] as Array<{
        command_id: string;
        state: string;
      }>;
      for (const c of ids) expect(listed.find((l) => l.command_id === c)?.state).toBe("exited");
      expect(kept.stray).toEqual([]);

      // A message that is no command is a protocol violation, as on a one-shot socket.
      kept.ws.send("not json");
      const closed = await kept.closed;
      expect(closed.code).toBe(1008);
      expect(kept.stray).toMatchObject([{ type: "error", code: "invalid_command" }]);
    } finally {
      kept.ws.terminate();
    }
  });

  it("closes with 1008 on a second message that is not a command", async () => {
    const kept = await KeptSocket.open(ts.wsUrl, id);
    try {
      expect((await kept.run({ cmd: "true" })).exit?.exit_code).toBe(0);
      kept.send({ cmd: "" });
      expect((await kept.closed).code).toBe(1008);
      expect(kept.stray).toMatchObject([{ type: "error", code: "invalid_command" }]);
    } finally {
      kept.ws.terminate();
    }
  });

  it("a foreground command still dies with its socket; a clean close between commands ends nothing", async () => {
    const kept = await KeptSocket.open(ts.wsUrl, id);
    expect((await kept.run({ cmd: "true" })).exit?.exit_code).toBe(0);
    let commandId = "";
    const running = new Promise<void>((resolve) => {
      kept
        .run({ cmd: "sleep 60" }, (ev) => {
          if (ev.type !== "started") return;
          commandId = ev.command_id;
          resolve();
        })
        .catch(() => undefined);
    });
    await running;
    kept.ws.close(1000);
    await kept.closed;
    const info = await waitForCommandEnd(ts.url, id, commandId);
    expect(info["state"]).toBe("exited");
    expect(info["signal"]).toBe("SIGKILL");
  });

  it("without keep, the socket still closes after one command and sends no ready", async () => {
    const r = await runCommand(ts.wsUrl, id, { cmd: "echo once" });
    expect(r.closeCode).toBe(1000);
    expect(r.events.map((e) => e.event.type)).toEqual(["started", "stdout", "process_exited"]);
  });

  it("refuses a keep value that is not a flag before the upgrade", async () => {
    const res = await api(ts.url, "GET", `/sandboxes/${id}/command?keep=always`);
    expect(res.status).toBe(400);
    expect(res.json["code"]).toBe("invalid_request");
  });

  it("counts a kept socket between commands as the client's connection for delete_on_disconnect", async () => {
    const other = await createSandbox(ts.url, {
      template: "seed",
      vcpu: 1,
      memoryMib: 512,
      deleteOnDisconnect: true,
      disconnectGraceS: 600,
    });
    const graces = (event: string): number =>
      ts.events.filter((e) => e.event === event && "sandbox_id" in e && e.sandbox_id === other).length;
    try {
      const kept = await KeptSocket.open(ts.wsUrl, other);
      expect((await kept.run({ cmd: "true" })).exit?.exit_code).toBe(0);
      // A second one, closed cleanly between commands: the first still holds the sandbox.
      const clean = await KeptSocket.open(ts.wsUrl, other);
      expect((await clean.run({ cmd: "true" })).exit?.exit_code).toBe(0);
      clean.ws.close(1000);
      await clean.closed;
      kept.ws.terminate();
      await pollUntil("the disconnect grace to start", () => graces("disconnect_grace_started") === 1);
      const back = await KeptSocket.open(ts.wsUrl, other);
      await pollUntil("the disconnect grace to be cancelled", () => graces("disconnect_grace_cancelled") === 1);
      back.ws.close(1000);
      await back.closed;
      expect(graces("disconnect_grace_started")).toBe(1);
    } finally {
      await api(ts.url, "DELETE", `/sandboxes/${other}`);
    }
  });

  it("closes an idle kept socket when its sandbox is deleted", async () => {
    const other = await createSandbox(ts.url);
    const kept = await KeptSocket.open(ts.wsUrl, other);
    try {
      expect((await kept.run({ cmd: "true" })).exit?.exit_code).toBe(0);
      expect((await api(ts.url, "DELETE", `/sandboxes/${other}`)).status).toBe(200);
      const closed = await kept.closed;
      expect(closed).toEqual({ code: 1001, reason: "sandbox deleted" });
      expect(kept.stray).toMatchObject([{ type: "error", code: "sandbox_not_running" }]);
      expect(await waitDeleted(ts.url, other)).toBe("deleted");
    } finally {
      kept.ws.terminate();
    }
  });
});

describe("kept command socket and idle sleep [gvisor]", () => {
  let ts: TestServer;
  const { asleep, state, waitForState } = useIdleServer("gvisor", (s) => (ts = s));

  it("an idle kept socket lets its sandbox sleep, and its next command wakes it", { timeout: 300_000 }, async () => {
    const id = await createSandbox(ts.url);
    const kept = await KeptSocket.open(ts.wsUrl, id);
    try {
      expect((await kept.run({ cmd: "echo kept > /workspace/note" })).exit?.exit_code).toBe(0);
      expect(await waitForState(id, asleep, IDLE_S + 30)).toBe(asleep);
      // The same socket, still open: the command wakes the sandbox first, its stdin waits meanwhile.
      const r = await kept.run({ cmd: "cat /workspace/note -", stdin: true }, (ev) => {
        if (ev.type === "started") kept.send({ type: "stdin_eof" });
      });
      expect(r).toMatchObject({ stdout: "kept\n", exit: { exit_code: 0 } });
      expect(await state(id)).toBe("running");
      // Sent before the wake has ended: the command and its input wait together.
      expect(await waitForState(id, asleep, IDLE_S + 30)).toBe(asleep);
      const runs = kept.run({ cmd: "cat", stdin: true });
      kept.send({ type: "stdin", data: "queued\n" });
      kept.send({ type: "stdin_eof" });
      expect(await runs).toMatchObject({ stdout: "queued\n", exit: { exit_code: 0 } });
      expect(kept.stray).toEqual([]);
    } finally {
      kept.ws.close(1000);
      await api(ts.url, "DELETE", `/sandboxes/${id}`);
    }
  });
});

/** Polls the command's record until it has ended (the server kills it when its socket goes). */
async function waitForCommandEnd(base: string, id: string, commandId: string): Promise<Record<string, unknown>> {
  let info: Record<string, unknown> = {};
  await pollUntil(`${commandId} to end after its socket closed`, async () => {
    info = (await api(base, "GET", `/sandboxes/${id}/commands/${commandId}`)).json;
    return info["state"] !== "running";
  });
  return info;
}
