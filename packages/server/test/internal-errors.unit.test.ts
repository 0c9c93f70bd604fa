import { BothyError } from "@bothy/protocol";
import Fastify from "fastify";
import { describe, expect, it } from "vitest";
import { sendProblem } from "../src/api/problem.ts";
import {
  BootError,
  describeCauses,
  HostSetupError,
  NetworkSetupError,
  NotSupportedError,
  TemplateError,
  toCreateFailure,
  toResumeFailure,
  toWakeFailure,
} from "../src/errors/internal-errors.ts";
import { HostCommandError } from "../src/util/host-command.ts";

/** What a host command prints is internal: it must reach the log, never a client. */
const SECRET = "mount: /var/lib/bothy/sandboxes/sbx_x/rootfs: wrong fs type (secret-stderr)";

function bootFailure(): BootError {
  const host = new HostCommandError("mount", ["-t", "overlay"], 32, SECRET);
  const net = new NetworkSetupError("Could not set up the sandbox's network.", { cause: host });
  return new BootError("start", "Could not start the gVisor sandbox.", { cause: net, diagnostics: "runsc: exit 1" });
}

describe("internal errors", () => {
  it("keep their cause chain and name, and carry no status or code", () => {
    const err = bootFailure();
    expect(err).not.toBeInstanceOf(BothyError);
    expect(err.name).toBe("BootError");
    expect(err.step).toBe("start");
    expect(err.cause).toBeInstanceOf(NetworkSetupError);
    expect((err.cause as Error).cause).toBeInstanceOf(HostCommandError);
    expect("status" in err || "code" in err).toBe(false);
  });

  it("a create that failed inside becomes create_failed with the internal error's own message, cause kept", () => {
    const err = bootFailure();
    const answer = toCreateFailure(err);
    expect(answer.code).toBe("create_failed");
    expect(answer.status).toBe(500);
    expect(answer.message).toBe("Could not start the gVisor sandbox.");
    expect(answer.cause).toBe(err);
    expect(toCreateFailure(new TemplateError("The guest kernel could not be fetched.")).message).toBe(
      "The guest kernel could not be fetched.",
    );
  });

  it("anything else thrown during a create is create_failed with a generic message", () => {
    const host = new HostCommandError("runsc", ["run"], 1, SECRET);
    const answer = toCreateFailure(host);
    expect(answer.code).toBe("create_failed");
    expect(answer.message).not.toContain("secret-stderr");
    expect(answer.message).toContain("server log");
    expect(answer.cause).toBe(host);
  });

  it("a BothyError meant for the client passes as it is", () => {
    const notBuilt = new BothyError("template_not_built", 'Template "x" is defined but not built yet.');
    expect(toCreateFailure(notBuilt)).toBe(notBuilt);
    expect(toResumeFailure(notBuilt)).toBe(notBuilt);
  });

  it("a wake that failed is sandbox_not_running naming the sandbox, without the cause's text", () => {
    const answer = toWakeFailure("sbx_abc", bootFailure());
    expect(answer.code).toBe("sandbox_not_running");
    expect(answer.message).toBe(
      "Sandbox sbx_abc could not be started again; its files are kept: Could not start the gVisor sandbox.",
    );
    expect(answer.cause).toBeInstanceOf(BootError);
    const gone = new BothyError("template_not_built", "its template build seed@abc is no longer on this host.");
    expect(toWakeFailure("sbx_abc", gone).message).toContain("is no longer on this host.");
    expect(toWakeFailure("sbx_abc", new Error(SECRET)).message).not.toContain("secret-stderr");
  });

  it("a resume that failed is agent_unavailable", () => {
    const answer = toResumeFailure(
      new BootError("handshake", "Sandbox sbx_a was restored but its agent did not answer."),
    );
    expect(answer.code).toBe("agent_unavailable");
    expect(answer.message).toBe("Sandbox sbx_a was restored but its agent did not answer.");
    expect(toResumeFailure(new Error(SECRET)).message).not.toContain("secret-stderr");
  });

  it("describeCauses gives the whole chain on one line for the log", () => {
    const line = describeCauses(bootFailure());
    expect(line).toMatch(
      /^BootError: Could not start the gVisor sandbox\. \[runsc: exit 1\] <- NetworkSetupError: .* <- HostCommandError: mount /,
    );
    expect(line).toContain("secret-stderr");
    const loop = new Error("a");
    (loop as { cause?: unknown }).cause = loop;
    expect(describeCauses(loop)).toBe("Error: a");
    expect(describeCauses("plain")).toBe("plain");
  });
});

describe("the API boundary", () => {
  it("answers an internal error that escapes a route as problem+json create_failed, logging the cause, leaking nothing", async () => {
    const logged: BothyError[] = [];
    const app = Fastify();
    app.setErrorHandler((err, request, reply) => sendProblem(reply, request, err, (e) => logged.push(e)));
    app.post("/sandboxes", async () => {
      throw bootFailure();
    });
    try {
      const res = await app.inject({ method: "POST", url: "/sandboxes" });
      expect(res.statusCode).toBe(500);
      expect(res.headers["content-type"]).toContain("application/problem+json");
      const body = res.json<Record<string, unknown>>();
      expect(body).toMatchObject({ code: "create_failed", status: 500, detail: "Could not start the gVisor sandbox." });
      for (const leak of ["secret-stderr", "HostCommandError", "NetworkSetupError", "runsc: exit 1", "    at "])
        expect(res.body).not.toContain(leak);
      expect(logged).toHaveLength(1);
      expect(logged[0]?.cause).toBeInstanceOf(BootError);
      expect(describeCauses(logged[0]?.cause)).toContain("secret-stderr");
    } finally {
      await app.close();
    }
  });

  it("a host that cannot limit sandboxes is 501 not_supported at every boundary; a host setup problem a failed create", () => {
    const fix = "This host has cgroup v1 without cpu (cgroup controllers); set BOTHY_HOST_LIMITS=off to run without.";
    const refusal = new NotSupportedError(fix);
    expect(refusal).not.toBeInstanceOf(BothyError);
    expect(toCreateFailure(refusal)).toMatchObject({ code: "not_supported", message: fix, cause: refusal });
    expect(toResumeFailure(refusal)).toMatchObject({ code: "not_supported", message: fix });
    expect(toWakeFailure("sbx_a", refusal)).toMatchObject({ code: "sandbox_not_running" });
    expect(toWakeFailure("sbx_a", refusal).message).toContain(fix);
    const setup = new HostSetupError("runsc (gVisor) is not installed: run `apt-get install runsc`.");
    expect(toCreateFailure(setup)).toMatchObject({ code: "create_failed", message: setup.message });
  });
});
