import { describe, expect, it } from "vitest";
import {
  commandRequest,
  createSandboxRequest,
  ERROR_CODES,
  ERROR_STATUS,
  guestFrame,
  hostFrame,
  PROTOCOL_GENERATION,
  SANDBOX_ID_RE,
  TEMPLATE_NAME_RE,
  toBothyError,
  toProblem,
  BothyError,
} from "../src/index.ts";

describe("protocol surface", () => {
  // A change here is a change to the wire: bump PROTOCOL_GENERATION if it is incompatible.
  it("matches the snapshot", () => {
    const surface = {
      generation: PROTOCOL_GENERATION,
      host: hostFrame.def.options.map((o) => ({ t: o.shape.t.def.values[0], fields: Object.keys(o.shape).sort() })),
      guest: guestFrame.def.options.map((o) => ({ t: o.shape.t.def.values[0], fields: Object.keys(o.shape).sort() })),
    };
    expect(surface).toMatchInlineSnapshot(`
      {
        "generation": 2,
        "guest": [
          {
            "fields": [
              "agent",
              "gen",
              "pid",
              "t",
            ],
            "t": "hello",
          },
          {
            "fields": [
              "id",
              "pid",
              "t",
            ],
            "t": "started",
          },
          {
            "fields": [
              "fd",
              "id",
              "t",
            ],
            "t": "output",
          },
          {
            "fields": [
              "code",
              "id",
              "oom_killed",
              "signal",
              "t",
            ],
            "t": "exited",
          },
          {
            "fields": [
              "id",
              "t",
            ],
            "t": "file_chunk",
          },
          {
            "fields": [
              "id",
              "sha256",
              "size",
              "t",
            ],
            "t": "file_done",
          },
          {
            "fields": [
              "id",
              "stat",
              "t",
            ],
            "t": "stat_result",
          },
          {
            "fields": [
              "id",
              "t",
              "truncated",
            ],
            "t": "list_result",
          },
          {
            "fields": [
              "id",
              "t",
            ],
            "t": "done",
          },
          {
            "fields": [
              "bytes",
              "id",
              "t",
            ],
            "t": "file_ack",
          },
          {
            "fields": [
              "id",
              "t",
            ],
            "t": "identity_done",
          },
          {
            "fields": [
              "id",
              "ports",
              "t",
            ],
            "t": "ports_result",
          },
          {
            "fields": [
              "id",
              "t",
            ],
            "t": "tcp_opened",
          },
          {
            "fields": [
              "eof",
              "id",
              "t",
            ],
            "t": "tcp_data",
          },
          {
            "fields": [
              "bytes",
              "id",
              "t",
            ],
            "t": "tcp_ack",
          },
          {
            "fields": [
              "error",
              "id",
              "t",
            ],
            "t": "tcp_closed",
          },
          {
            "fields": [
              "code",
              "id",
              "message",
              "t",
            ],
            "t": "error",
          },
        ],
        "host": [
          {
            "fields": [
              "gen",
              "t",
            ],
            "t": "hello_ack",
          },
          {
            "fields": [
              "t",
            ],
            "t": "resync",
          },
          {
            "fields": [
              "cmd",
              "cwd",
              "env",
              "id",
              "pty",
              "stdin",
              "t",
            ],
            "t": "exec",
          },
          {
            "fields": [
              "cols",
              "id",
              "rows",
              "t",
            ],
            "t": "resize",
          },
          {
            "fields": [
              "eof",
              "id",
              "t",
            ],
            "t": "stdin",
          },
          {
            "fields": [
              "id",
              "signal",
              "t",
            ],
            "t": "signal",
          },
          {
            "fields": [
              "bytes",
              "id",
              "t",
            ],
            "t": "credit",
          },
          {
            "fields": [
              "id",
              "path",
              "t",
            ],
            "t": "file_read",
          },
          {
            "fields": [
              "id",
              "if_sha256",
              "mode",
              "path",
              "t",
            ],
            "t": "file_write",
          },
          {
            "fields": [
              "eof",
              "id",
              "t",
            ],
            "t": "file_chunk",
          },
          {
            "fields": [
              "id",
              "path",
              "sha256",
              "t",
            ],
            "t": "stat",
          },
          {
            "fields": [
              "id",
              "path",
              "t",
            ],
            "t": "list",
          },
          {
            "fields": [
              "id",
              "t",
            ],
            "t": "cancel",
          },
          {
            "fields": [
              "id",
              "parents",
              "path",
              "t",
            ],
            "t": "mkdir",
          },
          {
            "fields": [
              "id",
              "path",
              "recursive",
              "t",
            ],
            "t": "remove",
          },
          {
            "fields": [
              "from",
              "id",
              "t",
              "to",
            ],
            "t": "rename",
          },
          {
            "fields": [
              "id",
              "t",
            ],
            "t": "ports_list",
          },
          {
            "fields": [
              "id",
              "port",
              "t",
            ],
            "t": "tcp_open",
          },
          {
            "fields": [
              "eof",
              "id",
              "t",
            ],
            "t": "tcp_data",
          },
          {
            "fields": [
              "id",
              "max_processes",
              "root_bytes",
              "t",
            ],
            "t": "limits",
          },
          {
            "fields": [
              "id",
              "mounts",
              "t",
            ],
            "t": "volumes",
          },
          {
            "fields": [
              "env",
              "hostname",
              "id",
              "sandbox_id",
              "t",
              "time_ms",
            ],
            "t": "identity",
          },
        ],
      }
    `);
  });
});

describe("guest frame validation", () => {
  it("accepts a well-formed exec and rejects extra or wrong fields", () => {
    expect(hostFrame.safeParse({ t: "exec", id: 1, cmd: "ls" }).success).toBe(true);
    expect(hostFrame.safeParse({ t: "exec", id: 1, cmd: "ls", shell: "/bin/bash" }).success).toBe(false);
    expect(hostFrame.safeParse({ t: "exec", id: 0, cmd: "ls" }).success).toBe(false);
    expect(hostFrame.safeParse({ t: "exec", id: 1, cmd: "" }).success).toBe(false);
    expect(hostFrame.safeParse({ t: "signal", id: 1, signal: "SIGSTOP" }).success).toBe(false);
    expect(hostFrame.safeParse({ t: "file_read", id: 1, path: "/a\0b" }).success).toBe(false);
    expect(hostFrame.safeParse({ t: "nope" }).success).toBe(false);
    expect(hostFrame.safeParse(null).success).toBe(false);
  });

  it("rejects guest frames with unexpected codes", () => {
    expect(guestFrame.safeParse({ t: "error", code: "bad_frame", message: "x" }).success).toBe(true);
    expect(guestFrame.safeParse({ t: "error", code: "pwned", message: "x" }).success).toBe(false);
  });
});

describe("API schemas", () => {
  it("applies defaults and rejects unknown fields", () => {
    expect(createSandboxRequest.parse({})).toEqual({ template: "seed", vcpu: 1, memory_mib: 512 });
    expect(createSandboxRequest.safeParse({ template: "seed", gpu: 1 }).success).toBe(false);
    expect(commandRequest.safeParse({ cmd: "ls", timeout_s: -1 }).success).toBe(false);
    expect(commandRequest.safeParse({ type: "command", cmd: "ls" }).success).toBe(true);
  });

  it("keeps ids and template names free of path characters", () => {
    for (const bad of ["../x", "a/b", "A", "-x", "", "x".repeat(64), "a b", "a.b"])
      expect(TEMPLATE_NAME_RE.test(bad)).toBe(false);
    for (const good of ["seed", "code-runtime", "a1"]) expect(TEMPLATE_NAME_RE.test(good)).toBe(true);
    expect(SANDBOX_ID_RE.test("sbx_abcdefghijklmnopqrst")).toBe(true);
    expect(SANDBOX_ID_RE.test("sbx_../../../../../../etc")).toBe(false);
  });
});

describe("errors", () => {
  it("maps every code to a 4xx or 5xx status", () => {
    for (const code of ERROR_CODES) expect(ERROR_STATUS[code]).toBeGreaterThanOrEqual(400);
  });

  it("hides the text of unknown errors", () => {
    const e = toBothyError(new Error("secret path /var/lib/x"));
    expect(e.code).toBe("internal");
    expect(toProblem(e).detail).not.toContain("secret");
  });

  it("renders RFC 9457 problem details with the code", () => {
    const p = toProblem(new BothyError("sandbox_not_found", "No sandbox x."), "/sandboxes/x");
    expect(p).toMatchObject({
      status: 404,
      code: "sandbox_not_found",
      title: "Sandbox not found",
      detail: "No sandbox x.",
      instance: "/sandboxes/x",
    });
  });
});
