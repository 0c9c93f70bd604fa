import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { noLeaks } from "./helpers/host-state.ts";
import { api, createSandbox, runCommand } from "./helpers/client.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

let ts: TestServer;

beforeAll(async () => {
  ts = await startTestServer();
});

afterAll(async () => {
  expect(await ts.stop()).toEqual(noLeaks());
});

async function expectProblem(
  res: { status: number; type: string; json: Record<string, unknown> },
  status: number,
  code: string,
): Promise<void> {
  expect(res.status).toBe(status);
  expect(res.type).toContain("application/problem+json");
  expect(res.json).toMatchObject({ status, code });
  expect(typeof res.json["detail"]).toBe("string");
  expect(String(res.json["detail"])).not.toMatch(/\n\s+at /); // never a stack trace
}

describe("bad input gets a clear problem+json and creates nothing", () => {
  const cases: Array<
    [string, () => Promise<{ status: number; type: string; json: Record<string, unknown> }>, number, string]
  > = [
    ["malformed JSON", () => api(ts.url, "POST", "/sandboxes", '{"template": "seed",'), 400, "invalid_json"],
    ["empty JSON body", () => api(ts.url, "POST", "/sandboxes", ""), 400, "invalid_json"],
    ["a JSON array", () => api(ts.url, "POST", "/sandboxes", [1, 2]), 400, "invalid_request"],
    [
      "unknown template",
      () => api(ts.url, "POST", "/sandboxes", { template: "no-such-template" }),
      404,
      "template_not_found",
    ],
    [
      "template with path characters",
      () => api(ts.url, "POST", "/sandboxes", { template: "../../etc" }),
      400,
      "invalid_template_name",
    ],
    [
      "template with a slash",
      () => api(ts.url, "POST", "/sandboxes", { template: "seed/../seed" }),
      400,
      "invalid_template_name",
    ],
    ["vcpu zero", () => api(ts.url, "POST", "/sandboxes", { template: "seed", vcpu: 0 }), 400, "invalid_request"],
    [
      "vcpu too many",
      () => api(ts.url, "POST", "/sandboxes", { template: "seed", vcpu: 4096 }),
      400,
      "invalid_request",
    ],
    [
      "vcpu fractional",
      () => api(ts.url, "POST", "/sandboxes", { template: "seed", vcpu: 1.5 }),
      400,
      "invalid_request",
    ],
    [
      "memory too small",
      () => api(ts.url, "POST", "/sandboxes", { template: "seed", memory_mib: 1 }),
      400,
      "invalid_request",
    ],
    [
      "memory too large",
      () => api(ts.url, "POST", "/sandboxes", { template: "seed", memory_mib: 10_000_000 }),
      400,
      "invalid_request",
    ],
    [
      "memory as a string",
      () => api(ts.url, "POST", "/sandboxes", { template: "seed", memory_mib: "1024" }),
      400,
      "invalid_request",
    ],
    ["unknown field", () => api(ts.url, "POST", "/sandboxes", { template: "seed", cpus: 2 }), 400, "invalid_request"],
    [
      "oversized body",
      () => api(ts.url, "POST", "/sandboxes", { template: "seed", pad: "x".repeat(2 * 1024 * 1024) }),
      413,
      "body_too_large",
    ],
    [
      "wrong content type",
      () =>
        fetch(`${ts.url}/sandboxes`, { method: "POST", headers: { "content-type": "text/plain" }, body: "seed" }).then(
          asResult,
        ),
      415,
      "unsupported_media_type",
    ],
    [
      "bad Idempotency-Key",
      () => api(ts.url, "POST", "/sandboxes", { template: "seed" }, { "idempotency-key": "has spaces in it" }),
      400,
      "idempotency_key_invalid",
    ],
    ["unknown sandbox id", () => api(ts.url, "GET", "/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa"), 404, "sandbox_not_found"],
    ["malformed sandbox id", () => api(ts.url, "GET", "/sandboxes/..%2f..%2fetc"), 400, "invalid_sandbox_id"],
    [
      "delete of an unknown id",
      () => api(ts.url, "DELETE", "/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa"),
      404,
      "sandbox_not_found",
    ],
    ["unknown route", () => api(ts.url, "GET", "/nope"), 404, "route_not_found"],
    [
      "plain HTTP to the command socket",
      () => api(ts.url, "GET", "/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa/command"),
      404,
      "sandbox_not_found",
    ],
  ];

  for (const [name, call, status, code] of cases) {
    it(name, async () => {
      await expectProblem(await call(), status, code);
    });
  }

  it("left no sandbox behind", async () => {
    const list = await api(ts.url, "GET", "/sandboxes?all=1");
    expect(list.json["sandboxes"]).toEqual([]);
    expect(await ts.server.ledger.listSandboxes({ includeDeleted: true })).toEqual([]);
  });
});

describe("bad command messages", () => {
  let id: string;
  beforeAll(async () => {
    id = await createSandbox(ts.url);
  });

  it("answers a non-JSON first message with an error and closes", async () => {
    const r = await runCommand(ts.wsUrl, id, "echo hi");
    expect(r.error).toMatchObject({ type: "error", code: "invalid_command" });
    expect(r.closeCode).toBe(1008);
  });

  it("answers a message without cmd with an error", async () => {
    const r = await runCommand(ts.wsUrl, id, { command: "echo hi" });
    expect(r.error?.code).toBe("invalid_command");
  });

  it("refuses a bad environment name", async () => {
    const r = await runCommand(ts.wsUrl, id, { cmd: "true", env: { "BAD NAME": "x" } });
    expect(r.error?.code).toBe("invalid_command");
  });

  it("reports a missing cwd and still ends with process_exited", async () => {
    const r = await runCommand(ts.wsUrl, id, { cmd: "true", cwd: "/does/not/exist" });
    expect(r.error?.code).toBe("invalid_command");
    expect(r.events.at(-1)?.event.type).toBe("process_exited");
  });

  it("plain HTTP to the command socket of a running sandbox asks for an upgrade", async () => {
    const res = await api(ts.url, "GET", `/sandboxes/${id}/command`);
    await expectProblem(res, 426, "upgrade_required");
  });
});

async function asResult(res: Response): Promise<{ status: number; type: string; json: Record<string, unknown> }> {
  return {
    status: res.status,
    type: res.headers.get("content-type") ?? "",
    json: (await res.json()) as Record<string, unknown>,
  };
}
